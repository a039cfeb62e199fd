"""How DistributedDataParallel groups parameters into buckets (torch's rule), shared by the DDP module
and its apex-compatible mode (``_apex_ddp``) so that neither imports the other for it."""


def assign_buckets(order, nbytes, dtypes, limits):
    """Split parameter indices (taken in ``order``) into buckets of one dtype each.

    A bucket closes once it holds at least its limit of bytes; the first bucket of each dtype uses
    ``limits[0]``, later ones ``limits[1]`` (torch's first-bucket rule). Buckets come out in the
    order they filled, which is the order gradients are expected to become ready.
    """
    done = []
    open_ = {}
    for i in order:
        key = dtypes[i]
        cur = open_.get(key)
        if cur is None:
            cur = open_[key] = [[], 0, 0]
        cur[0].append(i)
        cur[1] += nbytes[i]
        if cur[1] >= limits[min(cur[2], len(limits) - 1)]:
            done.append(cur[0])
            open_[key] = [[], 0, cur[2] + 1]
    for cur in open_.values():
        if cur[0]:
            done.append(cur[0])
    return done
