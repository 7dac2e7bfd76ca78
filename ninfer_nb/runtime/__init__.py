"""cuda-python runtime: device selection, arenas, CAI-only Tensor, streams, events, pinned
staging and CUDA graphs. Importing this package needs no GPU; using it does."""
