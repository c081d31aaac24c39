"""NumPy reference functions of the ops with a host fallback (see the end of `Backend`).

One module per group of ops (``moe``, ``mla``, ``recurrent``, ...); each function takes and returns
host NumPy arrays and is the executable specification of its op.
"""
