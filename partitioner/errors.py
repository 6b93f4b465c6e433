"""The error the partitioner raises; its messages name the op, its source line and the fix."""


class PartitionError(RuntimeError):
    """The program cannot be partitioned as asked; the message names the op, its source and the fix."""
