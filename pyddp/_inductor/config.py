"""``pyddp._inductor.config``: torch._inductor.config's switches that training scripts set
(``coordinate_descent_tuning``, ``max_autotune``, ``triton.cudagraphs``, ``fx_graph_cache``, ...),
with torch 2.13's defaults.  Accepted and recorded, doing nothing (pyddp generates no kernels),
as pyddp.backends.cudnn's switches; an unknown name raises torch's AttributeError.
"""
from .._dynamo._switches import install as _install

_install(__name__, {
    "coordinate_descent_tuning": False,
    "coordinate_descent_check_all_directions": False,
    "max_autotune": False,
    "max_autotune_gemm": False,
    "max_autotune_pointwise": False,
    "epilogue_fusion": True,
    "freezing": False,
    "fx_graph_cache": True,
    "fx_graph_remote_cache": None,
    "force_fuse_int_mm_with_mul": False,
    "use_mixed_mm": True,
    "debug": False,
    "compile_threads": 2,
    "aggressive_fusion": False,
    "conv_1x1_as_mm": False,
    "split_reductions": True,
    "cpp_wrapper": False,
    "benchmark_kernel": False,
    "shape_padding": True,
    "permute_fusion": False,
    "fallback_random": False,
    "unroll_reductions_threshold": 8,
    "autotune_local_cache": True,
    "emulate_precision_casts": False,
    "max_fusion_size": 64,
    "group_fusion": False,
    "memory_planning": False,
    "reorder_for_compute_comm_overlap": False,
    "triton": {"cudagraphs": False, "unique_kernel_names": True, "cudagraph_trees": True,
               "descriptive_names": "original_aten"},
})
