"""specdec's own quantized runtimes, int8 and int4: batch-invariant, so a verify pass scores
every row bit for bit as a one-token step does.

kernels (the C++ extension) <- int4, int8, rows (formats, row-invariant operations) <- fused
(fused projections) <- convert (a float model put on a runtime) <- store (runtime forms on
disk).
"""
