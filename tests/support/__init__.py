"""What several test modules share: test models, reference implementations, NVIDIA's builders, damaged
and edited .pte files, lowering and runtime helpers. Test modules import from here, never from each other."""
