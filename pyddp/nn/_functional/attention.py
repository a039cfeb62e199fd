"""Attention: scaled_dot_product_attention (boolean or additive masks, causal, dropout) and
multi_head_attention_forward (torch.nn.MultiheadAttention's forward).
"""
from __future__ import annotations

import math

import numpy as np

from ... import _tensor as _t
from ..._tensor import Tensor, softmax
from ..._tensor._dtypes import _HALFS
from .._argcheck import require_tensors as _require_tensors
from .dropout import dropout
from .linear import linear

__all__ = ["scaled_dot_product_attention", "multi_head_attention_forward"]


def _mask_array(mask, name):
    """A mask argument as an ndarray (bool or float); None stays None."""
    if mask is None:
        return None
    a = mask._data if isinstance(mask, Tensor) else np.asarray(mask)
    if a.dtype != np.bool_ and a.dtype.kind != "f" and a.dtype not in _HALFS:
        raise AssertionError(f"only bool and floating types of {name} are supported")
    return a


def _float_mask(a, dtype):
    """torch's _canonical_mask: a bool mask becomes 0 / -inf (True = not attended)."""
    if a is None or a.dtype != np.bool_:
        return a
    out = np.zeros(a.shape, dtype=dtype)
    out[a] = -np.inf
    return out


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """softmax(Q K^T * scale + mask) V over the last two dimensions (torch's math reference).

    A bool ``attn_mask`` marks the positions that take part (True); a float one is added;
    ``is_causal`` applies the lower-triangular mask (then ``attn_mask`` must be None).
    """
    if enable_gqa:
        raise NotImplementedError("scaled_dot_product_attention: enable_gqa is not supported")
    L, S = query.shape[-2], key.shape[-2]
    E = query.shape[-1]
    s = 1.0 / math.sqrt(E) if scale is None else float(scale)
    qd = query._data.dtype
    bias = None
    if is_causal:
        if attn_mask is not None:
            raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be "
                               "set when is_causal=True")
        bias = _t.tensor(np.where(np.tri(L, S, dtype=bool), 0, -np.inf).astype(qd))
    elif attn_mask is not None:
        m = _mask_array(attn_mask, "attn_mask")
        if m.dtype == np.bool_:
            bias = _t.tensor(np.where(m, 0, -np.inf).astype(qd))
        else:  # a float mask is added (differentiably, when it is a Tensor)
            bias = attn_mask if isinstance(attn_mask, Tensor) else _t.tensor(m)
    scores = _t.matmul(query * s, key.transpose(-2, -1))
    if bias is not None:
        scores = scores + bias
    w = softmax(scores, -1)
    if dropout_p > 0.0:
        w = dropout(w, dropout_p, True)
    return _t.matmul(w, value)


def multi_head_attention_forward(query, key, value, embed_dim_to_check, num_heads, in_proj_weight,
                                 in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p,
                                 out_proj_weight, out_proj_bias, training=True,
                                 key_padding_mask=None, need_weights=True, attn_mask=None,
                                 use_separate_proj_weight=False, q_proj_weight=None,
                                 k_proj_weight=None, v_proj_weight=None, static_k=None,
                                 static_v=None, average_attn_weights=True, is_causal=False):
    """torch.nn.functional.multi_head_attention_forward on pyddp Tensors ((L, N, E) layout, or
    unbatched (L, E)); returns (attn_output, attn_weights or None)."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"multi_head_attention_forward(): argument '{name}' must be a pyddp "
                            f"Tensor, not {type(t).__name__}")
    kpm = _mask_array(key_padding_mask, "key_padding_mask")
    am = _mask_array(attn_mask, "attn_mask")
    qdim = query.ndim
    if qdim == 3:
        batched = True
        if key.ndim != 3 or value.ndim != 3:
            raise AssertionError(
                "For batched (3-D) `query`, expected `key` and `value` to be 3-D but found "
                f"{key.ndim}-D and {value.ndim}-D tensors respectively")
        if kpm is not None and kpm.ndim != 2:
            raise AssertionError("For batched (3-D) `query`, expected `key_padding_mask` to be "
                                 f"`None` or 2-D but found {kpm.ndim}-D tensor instead")
        if am is not None and am.ndim not in (2, 3):
            raise AssertionError("For batched (3-D) `query`, expected `attn_mask` to be `None`, "
                                 f"2-D or 3-D but found {am.ndim}-D tensor instead")
    elif qdim == 2:
        batched = False
        if key.ndim != 2 or value.ndim != 2:
            raise AssertionError(
                "For unbatched (2-D) `query`, expected `key` and `value` to be 2-D but found "
                f"{key.ndim}-D and {value.ndim}-D tensors respectively")
        if kpm is not None and kpm.ndim != 1:
            raise AssertionError("For unbatched (2-D) `query`, expected `key_padding_mask` to be "
                                 f"`None` or 1-D but found {kpm.ndim}-D tensor instead")
        if am is not None:
            if am.ndim not in (2, 3):
                raise AssertionError("For unbatched (2-D) `query`, expected `attn_mask` to be "
                                     f"`None`, 2-D or 3-D but found {am.ndim}-D tensor instead")
            if am.ndim == 3 and am.shape != (num_heads, query.shape[0], key.shape[0]):
                raise AssertionError(
                    f"Expected `attn_mask` shape to be {(num_heads, query.shape[0], key.shape[0])} "
                    f"but got {tuple(am.shape)}")
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if kpm is not None:
            kpm = kpm[None]
    else:
        raise AssertionError("query should be unbatched 2D or batched 3D tensor but received "
                             f"{qdim}-D query tensor")
    tgt_len, bsz, embed_dim = query.shape
    src_len = key.shape[0]
    fdt = query._data.dtype
    kpm = _float_mask(kpm, fdt)
    if is_causal and am is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the "
                           "Transformer module method `generate_square_subsequent_mask` to "
                           "create this mask.")
    if is_causal and kpm is None and not need_weights:
        # torch hands is_causal to scaled_dot_product_attention, which ignores the mask
        am = np.where(np.tri(tgt_len, src_len, dtype=bool), 0, -np.inf).astype(fdt)
    else:
        am = _float_mask(am, fdt)
    if embed_dim != embed_dim_to_check:
        raise AssertionError(f"was expecting embedding dimension of {embed_dim_to_check}, but "
                             f"got {embed_dim}")
    head_dim = embed_dim // num_heads
    if head_dim * num_heads != embed_dim:
        raise AssertionError(f"embed_dim {embed_dim} not divisible by num_heads {num_heads}")
    E = embed_dim
    if use_separate_proj_weight:
        if tuple(key.shape[:2]) != tuple(value.shape[:2]):
            raise AssertionError(f"key's sequence and batch dims {tuple(key.shape[:2])} do not "
                                 f"match value's {tuple(value.shape[:2])}")
        if q_proj_weight is None or k_proj_weight is None or v_proj_weight is None:
            raise AssertionError("use_separate_proj_weight is True but q_proj_weight, "
                                 "k_proj_weight or v_proj_weight is None")
        wq, wk, wv = q_proj_weight, k_proj_weight, v_proj_weight
    else:
        if tuple(key.shape) != tuple(value.shape):
            raise AssertionError(f"key shape {tuple(key.shape)} does not match value shape "
                                 f"{tuple(value.shape)}")
        if in_proj_weight is None:
            raise AssertionError("use_separate_proj_weight is False but in_proj_weight is None")
        wq, wk, wv = in_proj_weight[0:E], in_proj_weight[E:2 * E], in_proj_weight[2 * E:]
    if in_proj_bias is None:
        bq = bk = bv = None
    else:
        bq, bk, bv = in_proj_bias[0:E], in_proj_bias[E:2 * E], in_proj_bias[2 * E:]
    q = linear(query, wq, bq)
    k = linear(key, wk, bk)
    v = linear(value, wv, bv)
    if am is not None:
        if am.ndim == 2:
            if tuple(am.shape) != (tgt_len, src_len):
                raise RuntimeError(f"The shape of the 2D attn_mask is {list(am.shape)}, but "
                                   f"should be {(tgt_len, src_len)}.")
            am = am[None]
        elif am.ndim == 3:
            if tuple(am.shape) != (bsz * num_heads, tgt_len, src_len):
                raise RuntimeError(f"The shape of the 3D attn_mask is {list(am.shape)}, but "
                                   f"should be {(bsz * num_heads, tgt_len, src_len)}.")
        else:
            raise RuntimeError(f"attn_mask's dimension {am.ndim} is not supported")
    if bias_k is not None and bias_v is not None:
        if static_k is not None or static_v is not None:
            raise AssertionError("bias cannot be added to static key.")
        k = _t.cat([k, _t.cat([bias_k] * bsz, 1)])
        v = _t.cat([v, _t.cat([bias_v] * bsz, 1)])
        if am is not None:
            am = np.pad(am, [(0, 0)] * (am.ndim - 1) + [(0, 1)])
        if kpm is not None:
            kpm = np.pad(kpm, [(0, 0), (0, 1)])
    elif bias_k is not None or bias_v is not None:
        raise AssertionError("bias_k and bias_v must both be set or both be None")
    q = q.reshape(tgt_len, bsz * num_heads, head_dim).transpose(0, 1)
    k = (k.reshape(k.shape[0], bsz * num_heads, head_dim).transpose(0, 1) if static_k is None
         else static_k)
    v = (v.reshape(v.shape[0], bsz * num_heads, head_dim).transpose(0, 1) if static_v is None
         else static_v)
    if add_zero_attn:
        z = _t.zeros(bsz * num_heads, 1, head_dim, dtype=k.dtype)
        k = _t.cat([k, z], 1)
        v = _t.cat([v, z], 1)
        if am is not None:
            am = np.pad(am, [(0, 0)] * (am.ndim - 1) + [(0, 1)])
        if kpm is not None:
            kpm = np.pad(kpm, [(0, 0), (0, 1)])
    src_len = k.shape[1]
    if kpm is not None:
        if kpm.shape[0] != bsz:
            raise AssertionError(f"Expected key_padded_mask.shape[0] to be {bsz}, but got "
                                 f"{kpm.shape[0]}")
        if kpm.shape[1] != src_len:
            raise AssertionError(f"Expected key_padded_mask.shape[1] to be {src_len}, but got "
                                 f"{kpm.shape[1]}")
        kpm = np.broadcast_to(kpm.reshape(bsz, 1, 1, src_len),
                              (bsz, num_heads, 1, src_len)).reshape(bsz * num_heads, 1, src_len)
        am = kpm if am is None else am + kpm
    if not training:
        dropout_p = 0.0
    scores = _t.matmul(q * math.sqrt(1.0 / float(head_dim)), k.transpose(-2, -1))
    if am is not None:
        scores = scores + _t.tensor(am)
    w = softmax(scores, -1)
    wd = dropout(w, dropout_p, True) if dropout_p > 0.0 else w
    out = _t.matmul(wd, v)
    out = out.transpose(0, 1).reshape(tgt_len * bsz, embed_dim)
    out = linear(out, out_proj_weight, out_proj_bias).reshape(tgt_len, bsz, embed_dim)
    if not batched:
        out = out.squeeze(1)
    if not need_weights:
        return out, None
    w = wd.reshape(bsz, num_heads, tgt_len, src_len)  # torch returns them after dropout
    if average_attn_weights:
        w = w.mean(dim=1)
    if not batched:
        w = w.squeeze(0)
    return out, w


# a NumPy array where a Tensor is expected: torch's TypeError (pyddp/nn/_argcheck.py)
_require_tensors(globals(), __all__, Tensor)
