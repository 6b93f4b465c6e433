"""The lowering's error type."""


class LoweringError(ValueError):
    """A partition cannot be lowered; the message names the node, its source line and the fix."""
