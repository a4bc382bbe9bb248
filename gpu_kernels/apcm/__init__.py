"""A-PCM's kernels (Sadoghi, Jacobsen, ICDE 2014): the bitmap event encoding
(:mod:`.layout`) and the compressed matching stages on every core
(:mod:`.cpu`) and on the GPU (:mod:`.cuda`)."""
