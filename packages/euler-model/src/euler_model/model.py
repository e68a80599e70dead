"""The whole decoder: logits, the multi-token-prediction loss and its gradients.

tokens (B, T) -> embed -> n_layers x [attention block, ffn block] -> rmsnorm -> K heads
head k's logits at position t predict token t + 1 + k, i.e. targets[:, k + t]
loss = mean over the K heads of the masked cross-entropy of that head
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

import euler_kernels as ek
from euler_model.blocks import (
    FP8_SCALES,
    FP8_SLOT_FORMATS,
    layer_backward,
    layer_forward,
    norm_backward,
    norm_in,
)
from euler_model.config import ModelConfig
from euler_model.cpu_threads import cpu_workers, one_blas_thread_for, run_parts
from euler_model.recompute import LayerInput, layer_caches

_ROPE_TABLES: dict[tuple, tuple[Any, Any]] = {}
FP8_MATRICES = (".w_gate", ".w_up", ".w_down")  # multiplied in FP8 in the fp8 mode, with the heads


class TrunkCache(NamedTuple):
    """trunk_forward's cache, for trunk_backward."""

    embedding: Any  # ek.embedding_forward's
    layers: list  # each layer's blocks.LayerCache, or with recompute its recompute.LayerInput
    norm: Any  # the final norm's (blocks.norm_in)
    batch: int  # B
    seq: int  # T
    bf16: bool  # bf16 activations (the bf16 path)
    fp8: bool  # FP8 products in the layers: the last FFN takes the gradient's maximum


class ConditionCache(NamedTuple):
    """A conditioned head's caches (config.mtp_conditioned, head k >= 1): of e, the embedding of token
    t + k, and of its projection P_k e."""

    embedding: Any  # ek.embedding_forward's
    projection: Any  # ek.linear_forward's


def rope_for(config: ModelConfig, like: Any, positions: int | None = None) -> tuple[Any, Any]:
    """cos/sin tables (positions, head_dim // 2) in the array kind and dtype of `like`, memoised;
    positions defaults to the context (a speculative decode step computes a few past it)."""
    xp = ek.get_array_module(like)
    positions = config.context if positions is None else positions
    key = (config.head_dim, positions, config.rope_theta, np.dtype(like.dtype).str, xp.__name__)
    if key not in _ROPE_TABLES:
        _ROPE_TABLES[key] = ek.rope_tables(
            config.head_dim, positions, theta=config.rope_theta, dtype=like.dtype, xp=xp
        )
    return _ROPE_TABLES[key]


def trunk_forward(
    config: ModelConfig,
    params: dict[str, Any],
    tokens: Any,
    kv: Any = None,
    recompute: bool = False,
    fp8_scales: Any = None,
    keep_activations: bool = False,
    precision: ek.Precision = ek.EXACT,
) -> tuple[Any, TrunkCache]:
    """tokens (B, T) -> final-normed hidden state (B, T, C) and the cache for trunk_backward.

    precision: how the products and attention are computed on the GPU (euler_kernels.Precision; every
    precision computes the same on NumPy arrays). Its bf16 and fp8 modes are the bf16 path in training.

    On the GPU's bf16 path (see blocks.py) the hidden state is a bf16 activation: it only feeds the heads
    (float32 for conditioned heads, config.mtp_conditioned, which add to it; each product still rounds it).

    kv: a prefill's decode_state.PrefillRows (generation): each layer's keys and values are written into
    the decode state's rows for the decode steps that follow; no backward is possible.
    recompute: keep only the stream entering each layer, not its caches; trunk_backward re-runs the
    layer's forward from it (recompute.py). Also what a forward without backward uses (less memory).
    fp8_scales: delayed FP8 scales (ek.new_fp8_scales(blocks.fp8_scale_formats(config))) for the FFN's
    SwiGLU outputs in the fp8 mode (blocks.py); None: each FP8 operand cast with its own maximum.
    keep_activations: on the bf16 path, the caches keep each norm's output and the SwiGLU product instead
    of the backward re-making them (blocks.py; faster, 2C + F more bf16 values per token and layer).
    """
    if kv is not None and recompute:
        raise ValueError("trunk_forward: recompute is for a forward without KV cache")
    rope = rope_for(config, params["embed"])
    b, t = tokens.shape
    bf16 = kv is None and bf16_path(params, precision)  # bf16 activations (training, GPU)
    keep = keep_activations and bf16  # the bf16 caches keep what the backward would re-make
    fp8: list[str] = []
    if bf16:  # every block matrix rounded to bf16 in one launch, not one cast per product
        bf16_names = _block_bf16_names(params, precision)
        fp8 = [k for k in _block_matrices(params) if k not in bf16_names]
        params = _with_bf16_copies(params, bf16_names)
    x, c_emb = ek.embedding_forward(params["embed"], tokens)  # (B, T, C)
    stream = (x.reshape(b * t, config.dim), None)  # (N, C): the flat residual stream, see blocks.py
    layers: list = []
    for i in range(config.n_layers):
        layer_kv = None if kv is None else (kv, i)
        # FP8 copies a layer at a time: the caches keep only their transposed parts (the backward's), so
        # the row-major parts are freed with this dict, one layer's at most alive at once
        layer_params = _with_fp8_copies(params, [k for k in fp8 if k.startswith(f"layers.{i}.")])
        if fp8_scales is not None and fp8:  # the layer's slots of the delayed FP8 scales (blocks.py)
            layer_params = {**layer_params, FP8_SCALES: (fp8_scales, len(FP8_SLOT_FORMATS) * i)}
        inputs = (config, layer_params, i, stream, (b, t), rope)
        saved = LayerInput(*inputs, bf16, keep, precision) if recompute else None
        stream, cache = layer_forward(*inputs, layer_kv, bf16, keep, precision)
        del layer_params
        layers.append(cache if saved is None else saved)
        del cache  # with recompute the layer's caches are freed here
    # (N, C): the last block's branch added; float32 for conditioned heads, which add P_k e to it
    _, h, c_norm = norm_in(config, params["norm"], stream, bf16 and not config.mtp_conditioned)
    return h.reshape(b, t, config.dim), TrunkCache(c_emb, layers, c_norm, b, t, bf16, bool(fp8))


def trunk_backward(
    config: ModelConfig, dh: Any, cache: TrunkCache, bf16_grads: bool = False
) -> dict[str, Any]:
    """Gradients of trunk_forward (dh (B, T, C)) for every trunk parameter, layers in reverse order (a
    layer kept as its input is re-run first: one layer's caches at a time). bf16_grads (bf16 and fp8
    products, GPU): the layers' matrices' gradients are bf16 (blocks.py); the norms' and the embedding's
    stay float32."""
    b, t = cache.batch, cache.seq
    # ((N, C), its bf16 copy, the copy's maximum if FP8)
    dx, dnorm = norm_backward(None, dh.reshape(b * t, config.dim), cache.norm, cache.bf16, amax=cache.fp8)
    grads = {"norm": dnorm}
    for i in reversed(range(config.n_layers)):
        dx, g_layer = layer_backward(dx, layer_caches(cache.layers[i]), i, bf16_grads)
        grads.update(g_layer)
    grads["embed"] = ek.embedding_backward(dx[0].reshape(b, t, config.dim), cache.embedding)
    return grads


def bf16_path(params: dict[str, Any], precision: ek.Precision) -> bool:
    """Whether a training forward on these parameters takes the bf16 path: float32 CuPy parameters and a
    bf16 or fp8 precision (blocks.py)."""
    return precision.bf16 and ek.float32_on_gpu(params["embed"])


def _fp8_fits(params: dict[str, Any], name: str, precision: ek.Precision) -> bool:
    """Whether a matrix is multiplied in FP8: the fp8 precision on the GPU, and its sizes fit FP8 products
    (ek.fp8_fits; the others stay bf16)."""
    return precision.fp8 and ek.float32_on_gpu(params["embed"]) and ek.fp8_fits(params[name])


def _with_fp8_copies(params: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """params with the named float32 GPU matrices replaced by their e4m3 copies (ek.fp8_weights): the
    linear op then multiplies them in FP8 (the fp8 precision; weight gradients stay float32)."""
    return _with_copies(params, names, ek.fp8_weights)


def _block_matrices(params: dict[str, Any]) -> list[str]:
    return [k for k in params if k.startswith("layers.") and params[k].ndim == 2]


def _block_bf16_names(params: dict[str, Any], precision: ek.Precision) -> list[str]:
    """The block matrices a bf16 forward multiplies as bf16 copies: all but those FP8 takes, each layer's
    wq, wk and wv one after another (whatever order params lists them in), so that their copies, made in
    one allocation, are the row blocks of the joint q/k/v weight (ek.stacked_rows)."""
    fp8 = [k for k in _block_matrices(params) if k.endswith(FP8_MATRICES) and _fp8_fits(params, k, precision)]
    names = [k for k in _block_matrices(params) if k not in fp8]
    return sorted(names, key=_layer_order)


_IN_LAYER = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")  # param_shapes' order within a layer


def _layer_order(name: str) -> tuple[int, int, str]:
    """Sort key of a block matrix "layers.{i}.{w}": the layer, then param_shapes' order within it."""
    _, layer, w = name.split(".", 2)
    return int(layer), _IN_LAYER.index(w) if w in _IN_LAYER else len(_IN_LAYER), w


def _head_bf16_names(config: ModelConfig, params: dict[str, Any], precision: ek.Precision) -> list[str]:
    """The heads a bf16 forward multiplies as bf16 copies: all but those FP8 takes."""
    heads = (f"heads.{k}" for k in range(config.n_mtp_heads))
    return [n for n in heads if not _fp8_fits(params, n, precision)]


def bf16_weight_groups(
    config: ModelConfig, params: dict[str, Any], precision: ek.Precision
) -> list[list[str]]:
    """The float32 weights that the GPU's bf16 training forward multiplies as bf16 copies (every block
    matrix and head that FP8 does not take), in the groups it casts them in (one ek.to_bf16_many call
    each: the block matrices, the heads). A caller may pass those copies in params under the same names
    (uint16 arrays): the forward then uses them instead of casting the weights. Copies made by
    ek.to_bf16_many on the same groups are the very buffers the forward's own cast writes."""
    return [_block_bf16_names(params, precision), _head_bf16_names(config, params, precision)]


def _with_bf16_copies(params: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """params with the named float32 GPU matrices replaced by bf16 copies, all made in one launch (the
    copies are rewritten by the next call with the same weights; weight gradients stay float32). Names
    that hold a bf16 copy already (given by the caller) are left as they are."""
    return _with_copies(params, [n for n in names if not ek.is_bf16(params[n])], ek.to_bf16_many)


def _with_copies(params: dict[str, Any], names: list[str], make: Any) -> dict[str, Any]:
    """params with the named matrices replaced by make([those matrices]) (params itself for no names)."""
    return {**params, **dict(zip(names, make([params[n] for n in names])))} if names else params


def _check_tokens(config: ModelConfig, tokens: Any, where: str) -> None:
    if tokens.ndim != 2 or not 1 <= tokens.shape[1] <= config.context:
        raise ValueError(
            f"{where}: tokens must be (B, T) with 1 <= T <= context={config.context}, got {tokens.shape}"
        )


def logits(
    config: ModelConfig,
    params: dict[str, Any],
    tokens: Any,
    all_heads: bool = False,
    targets: Any = None,
    precision: ek.Precision = ek.EXACT,
) -> Any:
    """Head 0's logits (B, T, V), or every head's stacked as (K, B, T, V) when all_heads. Conditioned heads
    (config.mtp_conditioned) read the token before the one they predict: then all_heads needs the targets
    (B, T + K - 1), as for the loss. precision as trunk_forward's.

    >>> from euler_model import preset, init_params
    >>> cfg = preset("tiny"); p = init_params(cfg)
    >>> logits(cfg, p, np.zeros((2, 5), dtype=np.int64)).shape
    (2, 5, 64)
    """
    _check_tokens(config, tokens, "logits")
    b = tokens.shape[0]
    if ek.get_array_module(params["embed"]) is np and cpu_workers(b) > 1:  # rows split over worker threads

        def rows_logits(rows: slice) -> Any:
            part = None if targets is None else targets[rows]
            return _logits_rows(config, params, tokens[rows], all_heads, part, precision)

        return np.concatenate(run_parts(rows_logits, row_slices(b)), axis=-3)  # along B
    return _logits_rows(config, params, tokens, all_heads, targets, precision)


def row_slices(b: int) -> list[slice]:
    """The batch's rows in cpu_workers(b) contiguous slices of near-equal size, one per worker thread.

    >>> row_slices(1)
    [slice(0, 1, None)]
    """
    n = cpu_workers(b)
    return [slice(b * i // n, b * (i + 1) // n) for i in range(n)]


def _logits_rows(
    config: ModelConfig, params: dict, tokens: Any, all_heads: bool, targets: Any, precision: ek.Precision
) -> Any:
    """logits of these rows in the calling thread."""
    # no backward: keeps no layer's caches
    h, _ = trunk_forward(config, params, tokens, recompute=True, precision=precision)
    if not all_heads:
        return ek.linear_forward(h, params["heads.0"], precision=precision)[0]
    if config.mtp_conditioned and targets is None:
        raise ValueError("logits: all_heads of conditioned heads (mtp_conditioned) needs the targets")
    xp, t = ek.get_array_module(h), tokens.shape[1]
    heads = []
    for k in range(config.n_mtp_heads):
        a = h
        if config.mtp_conditioned and k >= 1:  # h + P_k e(x_{t+k})
            e = ek.embedding_forward(params["embed"], targets[:, k - 1 : k - 1 + t])[0]  # (B, T, C)
            a = h + ek.linear_forward(e, params[f"heads_cond.{k}"], precision=precision)[0]
        heads.append(ek.linear_forward(a, params[f"heads.{k}"], precision=precision)[0])
    return xp.stack(heads)


def _check_targets(config: ModelConfig, tokens: Any, targets: Any, loss_mask: Any, where: str) -> None:
    _check_tokens(config, tokens, where)
    b, t = tokens.shape
    want = (b, t + config.n_mtp_heads - 1)
    if tuple(targets.shape) != want:
        raise ValueError(
            f"{where}: targets must be (B, T + K - 1) = {want} for tokens {tuple(tokens.shape)} and "
            f"K={config.n_mtp_heads} heads, got {tuple(targets.shape)}"
        )
    if loss_mask is not None and tuple(loss_mask.shape) != want:
        raise ValueError(f"{where}: loss_mask must have the targets' shape {want}, got {loss_mask.shape}")


def _head_loss(config, params, h2, targets, loss_mask, k: int, precision) -> tuple[Any, Any, Any, Any]:
    """Head k's masked cross-entropy on h2 (N, C), with the linear and cross-entropy caches, and the cache
    of its conditioning (a ConditionCache; None unless config.mtp_conditioned and k >= 1: then head k reads
    h + P_k e, e the embedding of token t + k, the token before the one it predicts). On the bf16 path the
    logits are bf16, as autocast's heads write them (half the bytes of the largest activation; the loss and
    its statistics stay float32)."""
    t = h2.shape[0] // targets.shape[0]
    c_cond = None
    if config.mtp_conditioned and k >= 1:
        e, c_e = ek.embedding_forward(params["embed"], targets[:, k - 1 : k - 1 + t])  # (B, T, C): x_{t+k}
        pe, c_p = ek.linear_forward(e.reshape(h2.shape), params[f"heads_cond.{k}"], precision=precision)
        h2, c_cond = h2 + pe, ConditionCache(c_e, c_p)  # (N, C)
    bf16_logits = bf16_path(params, precision)
    z, c_head = ek.linear_forward(h2, params[f"heads.{k}"], bf16_logits, precision=precision)  # (N, V)
    tgt = targets[:, k : k + t].reshape(-1)  # head k at position i predicts token i + 1 + k
    mask = None if loss_mask is None else loss_mask[:, k : k + t].reshape(-1)
    loss, c_ce = ek.cross_entropy_forward(z, tgt, mask)
    return loss, c_head, c_ce, c_cond


def _head_params(
    config: ModelConfig, params: dict[str, Any], h: Any, precision: ek.Precision
) -> dict[str, Any]:
    """The heads' weights, as bf16 copies made in one launch when h is a bf16 activation (e4m3 copies in
    the fp8 mode)."""
    if not ek.is_bf16(h):
        return params
    bf16 = _head_bf16_names(config, params, precision)
    fp8 = [f"heads.{k}" for k in range(config.n_mtp_heads) if f"heads.{k}" not in bf16]
    return _with_bf16_copies(_with_fp8_copies(params, fp8), bf16)


def _heads_loss(config, params, h, targets, loss_mask, precision) -> Any:
    """Mean over the K heads of each head's masked cross-entropy (no gradients)."""
    params = _head_params(config, params, h, precision)
    h2 = h.reshape(-1, h.shape[-1])  # (N, C)
    heads = range(config.n_mtp_heads)
    losses = [_head_loss(config, params, h2, targets, loss_mask, k, precision)[0] for k in heads]
    return sum(losses) / config.n_mtp_heads


def _heads_loss_and_grads(
    config, params, h, targets, loss_mask, head_scales, grad_scale, bf16_grads, precision
) -> tuple[Any, Any, dict[str, Any]]:
    """The mean head loss, its gradient wrt h (B, T, C) and every head's weight gradient, one head at a
    time: a head's (N, V) logits are freed as soon as its gradient is taken, so only one head's logits
    exist at once (they are the largest activation of a small-vocabulary model).

    head_scales: one host number per head multiplying its loss and gradient (the rows of a split batch,
    see _split_loss_and_grads), or None for none. grad_scale: a 0-d array multiplying every
    gradient but not the loss (see loss_and_grads_on_device), or None for none. bf16_grads: the heads'
    weight gradients are bf16 (trunk_backward's).
    """
    dloss = 1.0 / config.n_mtp_heads  # d mean / d loss_k (a host number: nothing is copied to the device)
    if grad_scale is not None:  # the backward is linear: scaling dlogits scales every gradient
        master = params["embed"]  # float64 on the CPU's float64 path: 1 / K must not round to float32
        dloss = ek.get_array_module(master).asarray(grad_scale, dtype=master.dtype) * dloss
    params = _head_params(config, params, h, precision)
    in_place = bf16_path(params, precision)  # dlogits written over bf16 logits
    h2 = h.reshape(-1, h.shape[-1])  # (N, C)
    total, dh, grads = 0.0, None, {}
    for k in range(config.n_mtp_heads):
        loss, c_head, c_ce, c_cond = _head_loss(config, params, h2, targets, loss_mask, k, precision)
        scale = 1.0 if head_scales is None else head_scales[k]
        total = total + (loss if head_scales is None else loss * scale)
        # (N, V), bf16 on bf16, written over the bf16 logits (no second (N, V) array)
        dz = ek.cross_entropy_backward(dloss * scale, c_ce, bf16_out=ek.is_bf16(h), in_place=in_place)
        del c_ce  # the logits it holds can go before the next head's are made
        if c_cond is None:
            # (N, C), summed over heads
            dh, grads[f"heads.{k}"] = ek.linear_backward(dz, c_head, dx_into=dh, bf16_dweight=bf16_grads)
            continue
        da, grads[f"heads.{k}"] = ek.linear_backward(dz, c_head, bf16_dweight=bf16_grads)  # d (h + P_k e)
        dh = da if dh is None else dh + da
        de, grads[f"heads_cond.{k}"] = ek.linear_backward(da, c_cond.projection, bf16_dweight=bf16_grads)
        de_embed = ek.embedding_backward(de.reshape(*targets.shape[:1], -1, de.shape[-1]), c_cond.embedding)
        grads["embed.heads"] = de_embed if "embed.heads" not in grads else grads["embed.heads"] + de_embed
    return total / config.n_mtp_heads, dh.reshape(h.shape), grads


def loss_and_grads_on_device(
    config: ModelConfig,
    params: dict[str, Any],
    tokens: Any,
    targets: Any,
    loss_mask: Any = None,
    recompute: bool = False,
    grad_scale: Any = None,
    fp8_scales: Any = None,
    keep_activations: bool = False,
    bf16_grads: bool = False,
    precision: ek.Precision = ek.EXACT,
) -> tuple[Any, dict[str, Any]]:
    """`loss_and_grads` with the loss left as a 0-d array where it was computed: on the GPU nothing is
    read back to the host, so the whole call can be captured in a CUDA graph (token ids and targets are
    then not range-checked: check them before they reach the device).

    grad_scale: a 0-d array on the parameters' device (nothing is copied from the host) that multiplies
    every gradient (not the loss), applied to the loss's gradient before the backward: the gradients come
    out already weighted, with no pass over them afterwards (the training step's one micro-batch, step.py).
    fp8_scales, keep_activations: as trunk_forward's (GPU, bf16 and fp8 modes). bf16_grads (GPU, bf16 and
    fp8 modes): the gradients of the layers' matrices and of the heads are bf16 (uint16 bit patterns, as
    autocast's before their cast to float32); the norms' and the embedding's stay float32. precision as
    trunk_forward's."""
    _check_targets(config, tokens, targets, loss_mask, "loss_and_grads")
    if bf16_grads and not bf16_path(params, precision):
        raise ValueError("loss_and_grads: bf16_grads needs the GPU's bf16 or fp8 products")
    if ek.get_array_module(params["embed"]) is np and cpu_workers(tokens.shape[0]) > 1:
        return _split_loss_and_grads(config, params, tokens, targets, loss_mask, recompute, grad_scale)
    return _loss_and_grads_rows(
        config, params, tokens, targets, loss_mask, None, recompute, grad_scale, fp8_scales, keep_activations,
        bf16_grads, precision,
    )  # fmt: skip


def _loss_and_grads_rows(
    config, params, tokens, targets, loss_mask, head_scales=None, recompute=False, grad_scale=None,
    fp8_scales=None, keep_activations=False, bf16_grads=False, precision=ek.EXACT,
) -> tuple[Any, dict]:  # fmt: skip
    """The loss and every gradient of one batch (or one slice of rows of it, head_scales and grad_scale
    as in _heads_loss_and_grads), in the calling thread."""
    h, trunk_cache = trunk_forward(
        config, params, tokens, recompute=recompute, fp8_scales=fp8_scales, keep_activations=keep_activations,
        precision=precision,
    )  # fmt: skip
    loss, dh, grads = _heads_loss_and_grads(
        config, params, h, targets, loss_mask, head_scales, grad_scale, bf16_grads, precision
    )
    from_heads = grads.pop("embed.heads", None)  # the conditioned heads' share of the embedding's gradient
    grads.update(trunk_backward(config, dh, trunk_cache, bf16_grads))
    if from_heads is not None:
        grads["embed"] = grads["embed"] + from_heads
    return loss, {name: grads[name] for name in params}


def _split_loss_and_grads(
    config, params, tokens, targets, loss_mask, recompute=False, grad_scale=None
) -> tuple[Any, dict]:
    """The NumPy step over cpu_workers(B) slices of the batch's rows, one per worker thread (cpu_threads.py),
    summed. Head k's loss is sum(w * nll) / max(sum(w), 1) over the whole batch, so a slice's head-k loss
    and gradient are weighted by max(its sum(w), 1) / max(the batch's, 1): the sum over the slices is the
    whole batch's loss and gradient (up to rounding; the float64 gradient checks run this path)."""
    (b, t), heads = tokens.shape, range(config.n_mtp_heads)

    def denominator(rows: slice, k: int) -> float:  # max(sum(w), 1) of head k over these rows
        mask = None if loss_mask is None else loss_mask[rows, k : k + t]
        w = ek.cross_entropy_weights(targets[rows, k : k + t], mask, dtype=params["embed"].dtype)
        return max(float(w.sum()), 1.0)

    whole = [denominator(slice(None), k) for k in heads]

    def run(rows: slice) -> tuple[Any, dict]:
        scales = [denominator(rows, k) / whole[k] for k in heads]
        mask = None if loss_mask is None else loss_mask[rows]
        return _loss_and_grads_rows(
            config, params, tokens[rows], targets[rows], mask, scales, recompute, grad_scale
        )

    (loss, grads), *others = run_parts(run, row_slices(b))
    for part_loss, part_grads in others:  # each slice's gradients are its own new arrays
        loss = loss + part_loss
        for name, g in part_grads.items():
            grads[name] += g
    return loss, grads


def loss_and_grads(
    config: ModelConfig,
    params: dict[str, Any],
    tokens: Any,
    targets: Any,
    loss_mask: Any = None,
    recompute: bool = False,
    keep_activations: bool = False,
    precision: ek.Precision = ek.EXACT,
) -> tuple[float, dict[str, Any]]:
    """The MTP training loss and its gradient for every parameter (keyed like params).

    tokens (B, T) int; targets and loss_mask (B, T + K - 1); head k is scored on targets[:, k:k+T].
    recompute: keep only each layer's input in the forward and re-run the layer in the backward (less
    memory, one more forward of the blocks; the same gradients bit for bit, see recompute.py).
    keep_activations: as trunk_forward's (the GPU's bf16 path; elsewhere nothing is re-made); precision
    too.

    >>> from euler_model import preset, init_params
    >>> cfg = preset("tiny"); p = init_params(cfg)
    >>> tok = np.zeros((1, 4), dtype=np.int64); tgt = np.ones((1, 4 + cfg.n_mtp_heads - 1), dtype=np.int64)
    >>> loss, grads = loss_and_grads(cfg, p, tok, tgt)
    >>> sorted(grads) == sorted(p)
    True
    """
    loss, grads = loss_and_grads_on_device(
        config, params, tokens, targets, loss_mask, recompute, keep_activations=keep_activations,
        precision=precision,
    )  # fmt: skip
    return float(loss), grads


def forward_loss(
    config: ModelConfig,
    params: dict[str, Any],
    tokens: Any,
    targets: Any,
    loss_mask: Any = None,
    precision: ek.Precision = ek.EXACT,
) -> float:
    """The same loss as loss_and_grads, for evaluation: no gradients are computed; precision as
    trunk_forward's."""
    _check_targets(config, tokens, targets, loss_mask, "forward_loss")
    with one_blas_thread_for(params["embed"]):
        # no backward: keeps no layer's caches
        h, _ = trunk_forward(config, params, tokens, recompute=True, precision=precision)
        return float(_heads_loss(config, params, h, targets, loss_mask, precision))
