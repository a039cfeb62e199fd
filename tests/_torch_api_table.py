"""Generate docs/torch-api.md: the public names training code uses, taken from torch itself,
against pyddp's (present / differs / absent).

    python tests/_torch_api_table.py          # rewrite docs/torch-api.md (torch 2.13 installed)

tests/project/test_torch_api_table.py regenerates it and fails when the committed page is stale, so adding
a function to pyddp (or finding a difference) shows up in the docs.  The categories: torch.*
functions, Tensor methods and properties (in-place ``_`` variants included), torch.nn modules,
torch.nn.functional, torch.optim optimizers and lr_scheduler, torch.amp / torch.cuda.amp,
torch.utils.data, torch.cuda.  "differs" rows come from DIFFERS below: names pyddp has whose
behaviour is knowingly not torch's.
"""
import importlib
import inspect
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "torch-api.md")
TORCH_VERSION = "2.13"

# torch.* names that are not training API (backends, quantization, sparse, internals, codegen)
_SKIP_TORCH = re.compile(
    r"^(_|fbgemm|quantize|q_|native_|cudnn|miopen|mkldnn|sparse|fake_quant|sym_|is_vulkan|"
    r"segment_reduce|batch_norm_|fused_|conv_tbc|choose_qparams|dequantize|int_repr|"
    r"embedding_renorm|rnn_|gru_cell|lstm_cell|quantized_|to_dlpack|from_file|"
    r"get_file_path|set_flush_denormal|compiled_with_cxx11_abi|vmap|compile|export|"
    r"cond$|while_loop|unify_type|classes|ops|library|jit|onnx|fx|package|profiler|"
    r"hub|testing|overrides|return_types|utils|autograd|backends|distributed|distributions|"
    r"masked|nested|special|linalg|fft|func|futures|mps|xpu|mtia|cpu$|accelerator|"
    r"storage|typename|can_cast|promote_types|result_type|is_storage|is_nonzero|"
    r"ccol_indices_copy|col_indices_copy|crow_indices_copy|row_indices_copy|values_copy|"
    r"indices_copy|.*_copy$|adaptive_|affine_grid|alpha_dropout|feature_)")
_SKIP_TENSOR = re.compile(
    r"^(_|sparse|to_sparse|to_mkldnn|q_|int_repr|dequantize|is_quantized|qscheme|"
    r"ccol_indices|col_indices|crow_indices|row_indices|indices|values|coalesce|is_coalesced|"
    r"smm|sspaddmm|to_padded_tensor|storage|untyped_storage|share_memory_|is_shared|"
    r"map_|map2_|apply_|module_load|dim_order|is_nested|nested|names|rename|refine_names|"
    r"align_|has_names|is_mkldnn|is_vulkan|is_xla|is_xpu|is_ipu|is_maia|is_meta|is_mps|"
    r"is_mtia|is_sparse|is_sparse_csr|is_quantized|is_inference|output_nr|itemsize|"
    r"nbytes|layout|is_neg|is_conj|resolve_|conj_physical|_)")


def _public_functions(mod, skip=None):
    out = set()
    for n in dir(mod):
        if n.startswith("_") or (skip is not None and skip.match(n)):
            continue
        obj = getattr(mod, n, None)
        if inspect.isclass(obj) or inspect.ismodule(obj) or not callable(obj):
            continue
        out.add(n)
    return out


def _classes(mod, base, names=None):
    out = set()
    for n in (names if names is not None else dir(mod)):
        obj = getattr(mod, n, None)
        if not n.startswith("_") and inspect.isclass(obj) and issubclass(obj, base) and \
                obj is not base:
            out.add(n)
    return out


def _categories():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch.optim as optim
    import torch.utils.data as data

    def tensor_names():
        out = set()
        for n in dir(torch.Tensor):
            if n.startswith("_") or _SKIP_TENSOR.match(n):
                continue
            out.add(n)
        return out

    lr = importlib.import_module("torch.optim.lr_scheduler")
    lr_names = _classes(lr, lr.LRScheduler) | ({"ReduceLROnPlateau"} if hasattr(
        lr, "ReduceLROnPlateau") else set())
    lr_names -= {"LRScheduler", "_LRScheduler"}
    return [
        ("torch.* functions", "torch", "pyddp", sorted(_public_functions(torch, _SKIP_TORCH))),
        ("Tensor methods and properties", "torch.Tensor", "pyddp.Tensor", sorted(tensor_names())),
        ("torch.nn modules", "torch.nn", "pyddp.nn",
         sorted(_classes(nn, nn.Module) - {"Module"})),
        ("torch.nn.functional", "torch.nn.functional", "pyddp.nn.functional",
         sorted(n for n in _public_functions(F) if not n.startswith("has_torch_function")
                and n not in ("handle_torch_function", "boolean_dispatch", "assert_int_or_pair"))),
        ("torch.optim optimizers", "torch.optim", "pyddp.optim",
         sorted(_classes(optim, optim.Optimizer))),
        ("torch.optim.lr_scheduler", "torch.optim.lr_scheduler", "pyddp.optim.lr_scheduler",
         sorted(lr_names)),
        ("torch.amp", "torch.amp", "pyddp.amp", ["GradScaler", "autocast", "custom_fwd",
                                                 "custom_bwd", "is_autocast_available"]),
        ("torch.cuda.amp", "torch.cuda.amp", "pyddp.cuda.amp", ["GradScaler", "autocast",
                                                                "custom_fwd", "custom_bwd"]),
        ("torch.utils.data", "torch.utils.data", "pyddp.utils.data",
         sorted(n for n in getattr(data, "__all__", dir(data)) if not n.startswith("_"))),
        ("torch.cuda", "torch.cuda", "pyddp.cuda",
         sorted(n for n in _public_functions(importlib.import_module("torch.cuda"))
                | {"Stream", "Event", "FloatTensor", "LongTensor", "HalfTensor"}
                if not n.startswith(("_", "jiterator", "tunable", "gds", "nvtx", "sparse",
                                     "graphs", "memory._")))),
    ]


# Names pyddp has whose behaviour is knowingly not torch's: (category module, name) -> note.
DIFFERS = {
    ("torch", "randn"): "pyddp's generator: same distribution, not bit-identical to torch "
                        "(randperm, shuffling and samplers are identical)",
    ("torch", "rand"): "as randn",
    ("torch", "manual_seed"): "seeds pyddp's generator (randperm/samplers match torch's; "
                              "randn/rand do not)",
    ("torch", "normal"): "as randn",
    ("torch", "randint_like"): "pyddp's generator: same distribution, not the same draws as torch",
    ("torch", "set_num_threads"): "limits NumPy's BLAS/OpenMP pools through threadpoolctl "
                                  "(without it the count is recorded, with a warning)",
    ("torch", "set_num_interop_threads"): "recorded with torch's checks (pyddp runs no inter-op "
                                          "pool)",
    ("torch", "use_deterministic_algorithms"): "recorded: pyddp's NumPy ops are deterministic, so "
                                               "none raises or warns",
    ("torch", "device"): "'cuda' places tensors only under PYDDP_CUDA_ON_CPU=1 (host memory); "
                         "otherwise raises as torch's CPU build",
    ("torch.Tensor", "cuda"): "raises as torch's CPU build, except under PYDDP_CUDA_ON_CPU=1 "
                              "(host memory, tagged cuda:N)",
    ("torch.Tensor", "topk"): "ties: pyddp returns the lowest indices first (torch leaves "
                              "their order unspecified)",
    ("torch.Tensor", "pin_memory"): "a copy in ordinary host memory",
    ("torch.Tensor", "backward"): "create_graph=True (higher-order gradients) is not supported",
    ("torch.nn", "Module"): "Module.to(device) / .cuda() keep parameters in host memory",
    ("torch.nn", "DataParallel"): "runs the module once (a machine without several GPUs)",
    ("torch.cuda", "is_available"): "False without a GPU; True (one device per local rank) "
                                    "under PYDDP_CUDA_ON_CPU=1",
    ("torch.cuda", "device_count"): "as is_available",
    ("torch.cuda", "Stream"): "only under PYDDP_CUDA_ON_CPU=1 (ordered no-ops); use torch's or "
                              "CuPy's streams on a GPU",
    ("torch.cuda", "Event"): "as Stream",
    ("torch.cuda", "get_device_name"): "only under PYDDP_CUDA_ON_CPU=1 (names the stand-in)",
    ("torch.optim", "SparseAdam"): "raises NotImplementedError when constructed: pyddp has no "
                                   "sparse tensors",
    ("torch.utils.data", "DataLoader"): "workers are forked processes; pin_memory has no effect",
}


def _resolve(dotted, name):
    try:
        mod = importlib.import_module(dotted)
    except ImportError:
        if dotted == "pyddp.Tensor":
            import pyddp
            mod = pyddp.Tensor
        else:
            return False
    return hasattr(mod, name)


def generate() -> str:
    import torch
    cats = _categories()
    lines = [
        "# Torch API table",
        "",
        "Generated from torch " + TORCH_VERSION + " itself by `tests/_torch_api_table.py` (and kept "
        "current by `tests/project/test_torch_api_table.py`): the public names training code uses, in "
        "each of torch's modules, against pyddp's. **present**: pyddp has the name, with "
        "torch's behaviour as far as its tests compare them; **differs**: present, with the "
        "difference noted; **absent**: not in pyddp (a ported script that uses it needs a "
        "change, or torch kept for that part). Backends, quantization, sparse and complex "
        "internals, JIT/compile and the torch.distributed packages beyond data parallelism are "
        "left out of the lists (see [API coverage](api-coverage.md) for torch.distributed).",
        "",
        "| module | present | differs | absent |",
        "|---|---|---|---|",
    ]
    body = []
    for title, tmod, pmod, names in cats:
        present, differs, absent = [], [], []
        for n in names:
            if _resolve(pmod, n):
                (differs if (tmod, n) in DIFFERS else present).append(n)
            else:
                absent.append(n)
        lines.append(f"| {title} | {len(present)} | {len(differs)} | {len(absent)} |")
        body += ["", f"## {title}", "", f"`{tmod}` against `{pmod}`.", ""]
        body.append("**Present:** " + (", ".join(f"`{n}`" for n in present) or "none") + ".")
        body.append("")
        if differs:
            body += ["**Differs:**", "", "| name | how |", "|---|---|"]
            body += [f"| `{n}` | {DIFFERS[(tmod, n)]} |" for n in differs]
            body.append("")
        body.append("**Absent:** " + (", ".join(f"`{n}`" for n in absent) or "none") + ".")
    assert torch.__version__.startswith(TORCH_VERSION), torch.__version__
    return "\n".join(lines + body) + "\n"


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    text = generate()
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {OUT}")
