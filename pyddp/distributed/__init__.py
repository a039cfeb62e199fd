"""pyddp.distributed: torch.distributed's API for NumPy arrays (and torch CPU tensors).

    import pyddp.distributed as dist
    dist.init_process_group("cpu")          # env:// by default
    dist.all_reduce(grad, op=dist.ReduceOp.SUM)
"""
from .distributed_c10d import (  # noqa: F401
    Backend,
    DistBackendError,
    DistError,
    DistNetworkError,
    DistStoreError,
    Future,
    GroupMember,
    P2POp,
    ProcessGroup,
    ReduceOp,
    Work,
    all_gather,
    all_gather_into_tensor,
    all_gather_object,
    all_reduce,
    all_to_all,
    all_to_all_single,
    barrier,
    batch_isend_irecv,
    broadcast,
    broadcast_object_list,
    default_pg_timeout,
    destroy_process_group,
    explain,
    gather,
    gather_object,
    get_backend,
    get_pg_count,
    is_backend_available,
    supports_complex,
    get_global_rank,
    get_group_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    group,
    init_process_group,
    irecv,
    is_available,
    is_gloo_available,
    is_initialized,
    is_mpi_available,
    is_nccl_available,
    isend,
    monitored_barrier,
    _shared_array,
    _make_nccl_premul_sum,
    new_group,
    recv,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    scatter,
    scatter_object_list,
    send,
)
from ._compat import get_default_backend_for_device, reduce_op  # noqa: F401
from .store import FileStore, HashStore, PrefixStore, QueueEmptyError, Store, TCPStore  # noqa: F401
from ._observe import (  # noqa: F401
    DebugLevel,
    get_debug_level,
    set_debug_level,
    set_debug_level_from_env,
)
from . import flight_recorder  # noqa: F401,E402


def __getattr__(name):
    # torch.distributed.GradBucket: the class comm hooks receive (imported on first use so that
    # importing pyddp.distributed stays light).
    if name == "GradBucket":
        from ._grad_bucket import GradBucket

        return GradBucket
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
