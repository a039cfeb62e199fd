"""pyddp.nn.functional's operations by concern (the public names live in pyddp.nn.functional, which
re-exports them): linear, conv, pooling, dropout, sparse (embedding, one_hot), normalization,
activation, attention, distance, shape (pad, flatten), upsampling (interpolate,
pixel_shuffle); _common holds the argument and autocast
helpers they share.  The losses are pyddp/nn/_loss_functional.py."""
