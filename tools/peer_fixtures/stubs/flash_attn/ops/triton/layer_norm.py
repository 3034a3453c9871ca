"""CPU stand-in for flash_attn.ops.triton.layer_norm.rms_norm_fn, with the kernel's numerics.

flash-attn's `_layer_norm_fwd_1pass_kernel` (and its `rms_norm_ref` with `upcast=True`) loads the row, the
residual and the weight as float32, computes `rstd = 1 / sqrt(mean(x * x) + eps)` and `y = x * rstd * w` in
float32, and stores `y` once in the output dtype (the input's). So a bfloat16/float16 model's norm is rounded
once, after the weight multiply (transformers' `Qwen3RMSNorm` rounds before it). This stand-in computes the same
expression in the same order in plain torch.
"""

import torch


def rms_norm_fn(
    x,
    weight,
    bias,
    residual=None,
    x1=None,
    weight1=None,
    bias1=None,
    eps=1e-6,
    dropout_p=0.0,
    rowscale=None,
    prenorm=False,
    residual_in_fp32=False,
    is_rms_norm=True,
    return_dropout_mask=False,
    out_dtype=None,
    **kwargs,
):
    if x1 is not None or weight1 is not None or rowscale is not None or dropout_p != 0.0:
        raise NotImplementedError("rms_norm_fn CPU stand-in: x1 / weight1 / rowscale / dropout are not supported")
    xf = x.float()
    if residual is not None:
        xf = xf + residual.float()
    rstd = 1 / torch.sqrt(xf.square().mean(dim=-1, keepdim=True) + eps)
    y = xf * rstd * weight.float()
    if bias is not None:
        y = y + bias.float()
    y = y.to(out_dtype if out_dtype is not None else x.dtype)
    if prenorm:
        res_dtype = torch.float32 if residual_in_fp32 else (residual.dtype if residual is not None else x.dtype)
        return y, xf.to(res_dtype)
    return y
