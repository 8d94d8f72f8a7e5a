"""The CPU path: C kernels (``csrc/``) built on first use and called through ctypes, bit-identical to the
references."""
