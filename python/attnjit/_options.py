"""The options every Python front end takes (causal, window, softcap, alibi,
scale, dropout, masks and score_mod expressions, side tensors, sinks), as
the IR body of an attention op (docs/ir.md): one home for the mapping, for
attnjit.torch and attnjit.jax alike.  No framework imported here."""
import attnjit

_WINDOW_MAX = 2**31 - 1
_ALIGN = ("top_left", "bottom_right")


def _fail(who, message):
    return attnjit.InvalidArgError(1, "%s: %s" % (who, message))


def _positional_mask(causal, window, who, align=None):
    """The built-in mask as IR (None for none), and as an expression.
    align: a window's alignment without causal (default top_left; the
    paged entries' queries are the last positions: bottom_right)."""
    if causal:
        align = "top_left" if causal is True else causal
        if align not in _ALIGN:
            raise _fail(who, "causal = %r; want False, True, 'top_left' or 'bottom_right'"
                        % (causal,))
    if window is None:
        if not causal:
            return None, None
        shift = "" if align == "top_left" else " + (sk - sq)"
        return "causal(%s)" % align, "k <= q%s" % shift
    try:
        left, right = window
    except (TypeError, ValueError):
        raise _fail(who, "window = %r; want (left, right)" % (window,)) from None
    left = _WINDOW_MAX if left is None or left < 0 else int(left)
    right = _WINDOW_MAX if right is None or right < 0 else int(right)
    if causal:
        right = 0       # causal and a window: FlashAttention's window_size=(left, 0)
    align = align or "top_left"
    if align not in _ALIGN:
        raise _fail(who, "window alignment %r; want 'top_left' or 'bottom_right'" % (align,))
    shift = "" if align == "top_left" else " + (sk - sq)"
    suffix = "" if align == "top_left" else ", bottom_right"
    return ("window(%d, %d%s)" % (left, right, suffix),
            "q%s - %d <= k && k <= q%s + %d" % (shift, left, shift, right))


_SINKS = "aj_sinks"     # the side tensor of learned sinks (docs/ir.md "Sinks")
_ALIBI = "aj_alibi_slopes"   # alibi's slopes as a side tensor: alibi(aj_alibi_slopes)
# oob="zero": the body's last line, an IR comment the launches read
# (check_side_bounds off: a load outside its side tensor reads 0)
_OOB_ZERO = "\n  # oob = zero"


def _body(dtype, d, dv, causal, window, softcap, alibi, has_bias, scale, dropout_p, mask,
          score_mod, side_decls, sinks=False, alibi_grad=False, who="attnjit.torch.attention",
          align=None):
    """The IR fields (docs/ir.md) of the op these options describe; the
    side tensors in order: side_decls, alibi's slopes where the built-in
    reads them as a side tensor (with softcap, or with alibi_grad: declared
    grad, the slopes' gradient is the side tensor's), then the sinks."""
    fields = ["dtype = %s" % dtype, "head_dim = %d" % d, "head_dim_v = %d" % dv]
    decls = list(side_decls)
    builtin, as_expr = _positional_mask(causal, window, who, align)
    if mask is not None:
        fields.append("mask = expr(%s)" % (mask if as_expr is None
                                           else "(%s) && (%s)" % (mask, as_expr)))
    elif builtin is not None:
        fields.append("mask = " + builtin)
    mods = [m for m in (softcap is not None, alibi, score_mod is not None) if m]
    if len(mods) > 1 and score_mod is not None:
        raise _fail(who, "score_mod cannot be combined with softcap or alibi_slopes: write "
                    "them into the expression (docs/ir.md, 'Expressions')")
    if alibi and (softcap is not None or alibi_grad):
        # softcap, then alibi (docs/ir.md); alibi's slopes as a side tensor
        decls.append("%s: f32[1]%s" % (_ALIBI, " grad" if alibi_grad else ""))
        cap = "" if softcap is None else "softcap(%r) + " % float(softcap)
        fields.append("score_mod = %salibi(%s)" % (cap, _ALIBI))
    elif softcap is not None:
        fields.append("score_mod = softcap(%r)" % float(softcap))
    elif alibi:
        fields.append("score_mod = alibi")
    elif score_mod is not None:
        fields.append("score_mod = expr(%s)" % score_mod)
    if scale is not None:
        fields.append("scale = %r" % float(scale))
    if dropout_p:
        fields.append("dropout = %r" % float(dropout_p))
    if has_bias:
        fields.append("bias = add")
    if sinks:
        decls.append("%s: f32[1]" % _SINKS)
        fields.append("sinks = " + _SINKS)
    if decls:
        fields.insert(0, "tensors = (%s)" % ", ".join(decls))
    return "\n  ".join(fields)


def _spec(kind, variant, body):
    return "attention %s %s {\n  %s\n}\n" % (kind, variant, body)
