"""attnjit as a transformers attention backend
(attnjit.torch.integrations.transformers): tiny random-init models built
from configs (no weights downloaded) with attn_implementation="attnjit"
against the same weights with "eager", in float32 on the cpu: logits with
and without left padding, packed sequences from position_ids, gradients
and a few training steps, attention dropout in training, KV-cache
generation, torch.compile(fullgraph=True);
GPT-OSS with its learned sinks (their gradients too); every decoder of the
library that transformers marks for attention backends.
transformers is installed by the README's test command."""
import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attnjit  # noqa: E402
import attnjit.torch.integrations.transformers as ajt  # noqa: E402

ajt.register()

TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=128, pad_token_id=0)

FAMILIES = {  # name: (config class name, model class name, extra config)
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=8)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(sliding_window=8, attn_logit_softcapping=20.0, query_pre_attn_scalar=16)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(sliding_window=8, query_pre_attn_scalar=16)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(head_dim=None)),
}


def build(family, impl, seed=0):
    cfg_name, model_name, extra = FAMILIES[family]
    kw = dict(TINY, **extra)
    kw = {k: v for k, v in kw.items() if v is not None}
    cfg = getattr(transformers, cfg_name)(**kw)
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(cfg).float().eval()
    other = copy.deepcopy(model)
    model.set_attn_implementation(impl)
    other.set_attn_implementation("eager")
    return model, other


def tokens(b, s, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, TINY["vocab_size"], (b, s), generator=g)


def assert_close(got, want, what):
    scale = want.abs().max().item()
    err = (got - want).abs().max().item()
    assert err <= 2e-4 * max(scale, 1.0), "%s: max error %.3g (scale %.3g)" % (what, err, scale)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_match_eager(family):
    model, eager = build(family, "attnjit")
    ids = tokens(2, 24)
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[1, :5] = 0                                     # left padding
    with torch.no_grad():
        for m in (None, mask):
            got = model(input_ids=ids, attention_mask=m).logits
            want = eager(input_ids=ids, attention_mask=m).logits
            keep = torch.ones(2, 24, dtype=torch.bool) if m is None else m.bool()
            assert_close(got[keep], want[keep], "%s %s" % (family, "padded" if m is not None
                                                           else "unpadded"))


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma2"])
def test_packed_sequences_from_position_ids(family):
    """Two documents in one row: positions restart, the second does not see
    the first (transformers' packed-sequence mask)."""
    model, eager = build(family, "attnjit")
    ids = tokens(1, 26, seed=2)
    pos = torch.cat([torch.arange(11), torch.arange(15)]).unsqueeze(0)
    with torch.no_grad():   # (transformers packs from position_ids without a cache)
        got = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        want = eager(input_ids=ids, position_ids=pos, use_cache=False).logits
        alone = eager(input_ids=ids[:, 11:], use_cache=False).logits
    assert_close(got, want, family + " packed")
    assert_close(got[:, 11:], alone, family + " the second document alone")


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_packed_rows_with_varlen_kwargs(family):
    """DataCollatorWithFlattening's flash-attention keyword arguments
    (cu_seq_lens_q/k, max_length_q/k) run attention_varlen; logits and
    gradients as eager's with the same packing from position_ids."""
    model, eager = build(family, "attnjit")
    ids = tokens(1, 26, seed=6)
    lens = [11, 4, 11]
    pos = torch.cat([torch.arange(n) for n in lens]).unsqueeze(0)
    cu = torch.tensor([0, 11, 15, 26], dtype=torch.int32)
    kw = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=11, max_length_k=11)
    got = model(input_ids=ids, position_ids=pos, use_cache=False, **kw).logits
    want = eager(input_ids=ids, position_ids=pos, use_cache=False).logits
    assert_close(got, want, family + " packed, varlen kwargs")
    got.square().mean().backward()
    want.square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        assert_close(p.grad, q.grad, "%s packed: grad of %s" % (family, name))


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_gradients_and_training_steps_match_eager(family):
    model, eager = build(family, "attnjit")
    model.train()
    eager.train()
    ids = tokens(2, 20, seed=3)
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[0, -4:] = 0                                    # right padding
    labels = ids.masked_fill(mask == 0, -100)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (model, eager)]
    for step in range(3):
        losses = []
        for m, opt in zip((model, eager), opts):
            opt.zero_grad()
            loss = m(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            losses.append(loss)
        assert abs(losses[0].item() - losses[1].item()) <= 1e-4 * abs(losses[1].item()), \
            "%s step %d: loss %.6f vs eager %.6f" % (family, step, losses[0], losses[1])
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            assert_close(p.grad, q.grad, "%s step %d: grad of %s" % (family, step, name))
        for opt in opts:
            opt.step()


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen3"])
def test_kv_cache_generation_matches_eager(family):
    model, eager = build(family, "attnjit")
    ids = tokens(2, 9, seed=4)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        got = model.generate(ids, **kw)
        want = eager.generate(ids, **kw)
    assert torch.equal(got, want), "%s: %s vs eager %s" % (family, got.tolist(), want.tolist())


def test_gpt_oss_learned_sinks_match_eager():
    """GPT-OSS (learned sinks, sliding and full layers): logits and every
    parameter's gradient, the sinks' included, equal eager's."""
    cfg = transformers.GptOssConfig(**dict(TINY, num_local_experts=2, num_experts_per_tok=1,
                                           sliding_window=8, intermediate_size=64))
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_()
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    model.set_attn_implementation("attnjit")
    ids = tokens(2, 20, seed=8)
    got, want = model(input_ids=ids).logits, eager(input_ids=ids).logits
    assert_close(got, want, "gpt-oss")
    got.square().mean().backward()
    want.square().mean().backward()
    for (name, p), (_, p_eager) in zip(model.named_parameters(), eager.named_parameters()):
        if p_eager.grad is not None:
            assert_close(p.grad, p_eager.grad, "gpt-oss d" + name)
    assert model.model.layers[0].self_attn.sinks.grad.abs().sum() > 0


def test_torch_compile_fullgraph():
    model, eager = build("llama", "attnjit")
    ids = tokens(2, 24, seed=5)
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[1, :5] = 0
    with torch.no_grad():
        got = torch.compile(model, fullgraph=True)(input_ids=ids, attention_mask=mask).logits
        want = eager(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()
    assert_close(got[keep], want[keep], "llama compiled")


def test_attention_dropout_in_training():
    """attention_dropout reaches attnjit's dropout in training only: train
    mode with the same seed gives the same logits bit for bit, another seed
    others, eval mode eager's; the backward gives finite gradients."""
    TINY_DROP = dict(TINY, attention_dropout=0.3)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY_DROP)).float()
    eager = copy.deepcopy(model)
    model.set_attn_implementation("attnjit")
    eager.set_attn_implementation("eager")
    ids = tokens(2, 16, seed=9)
    model.train()
    runs = []
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        runs.append(model(input_ids=ids).logits)
    assert torch.equal(runs[0], runs[1]), "one seed, two different dropout masks"
    assert (runs[0] - runs[2]).abs().max() > 1e-3, "the seed does not reach the dropout"
    runs[0].square().mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.eval()
    eager.eval()
    with torch.no_grad():
        got, want = model(input_ids=ids).logits, eager(input_ids=ids).logits
    assert (runs[0].detach() - got).abs().max() > 1e-3, "training logits equal eval's"
    assert_close(got, want, "llama eval with attention_dropout")


# ---------------------------------------------------------------- every decoder

SHRINK = dict(TINY, moe_intermediate_size=32, num_experts=2, num_local_experts=2,
              n_routed_experts=2, num_experts_per_tok=1, shared_expert_intermediate_size=32,
              rotary_dim=8, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
              qk_nope_head_dim=8, v_head_dim=16, qk_head_dim=16)
SHRINK.pop("pad_token_id")


def _tiny_decoder(cls):
    """A tiny random-init model of cls from its config class with the sizes
    above where the config has them, or None with a reason when the
    generic shrink does not make a small, working model of it.  A default
    pad token past the tiny vocabulary becomes 0; MLA configs (a rope head
    dim of their own) get head_dim = qk_rope_head_dim and one KV head per
    query head, as their attention expands k_pe to every head."""
    base = cls.config_class()
    kw = {k: v for k, v in SHRINK.items() if hasattr(base, k)}
    pad = getattr(base, "pad_token_id", None)
    if isinstance(pad, int) and pad >= SHRINK["vocab_size"]:
        kw["pad_token_id"] = 0
    if hasattr(base, "qk_rope_head_dim"):
        kw["head_dim"] = kw["qk_rope_head_dim"]
        kw["num_key_value_heads"] = kw["num_attention_heads"]
    cfg = cls.config_class(**kw)
    with torch.device("meta"):
        n = sum(p.numel() for p in cls(cfg).parameters())
    if n > 20_000_000:
        return None, "%d parameters after the generic shrink" % n
    torch.manual_seed(0)
    return cls(cfg).float().eval(), None


def test_every_decoder_with_the_attention_backend():
    """Every *ForCausalLM transformers marks _supports_attention_backend:
    a tiny model's logits with "attnjit" equal eager's (learned sinks
    included), none refused.  A model the generic
    shrink cannot build, or that fails under eager too, is counted and
    skipped (its config needs sizes of its own); none may fail or differ
    under attnjit alone."""
    names = sorted(n for n in dir(transformers) if n.endswith("ForCausalLM"))
    outcome = {"matched": [], "refused": [], "not built": []}
    for name in names:
        try:
            cls = getattr(transformers, name)
        except Exception:        # noqa: BLE001 -- an optional dependency missing
            outcome["not built"].append(name)
            continue
        if not getattr(cls, "_supports_attention_backend", False):
            continue
        ids = tokens(2, 12, seed=7)
        try:
            model, why = _tiny_decoder(cls)
            if model is None:
                outcome["not built"].append(name)
                continue
            eager = copy.deepcopy(model)
            eager.set_attn_implementation("eager")
            with torch.no_grad():
                want = eager(input_ids=ids).logits
        except Exception:        # noqa: BLE001 -- the shrink broke the model itself
            outcome["not built"].append(name)
            continue
        model.set_attn_implementation("attnjit")
        try:
            with torch.no_grad():
                got = model(input_ids=ids).logits
        except attnjit.Error as e:
            why = "learned sinks" if "learned sinks" in e.message else e.message[:120]
            outcome["refused"].append("%s (%s)" % (name, why))
            continue
        assert_close(got, want, name)
        outcome["matched"].append(name)
    print("\n%d decoders match eager, %d refused, %d not built by the generic shrink"
          % tuple(len(outcome[k]) for k in ("matched", "refused", "not built")))
    print("refused: " + ", ".join(outcome["refused"]))
    print("not built: " + ", ".join(outcome["not built"]))
    assert len(outcome["matched"]) >= 100, outcome
    assert not outcome["refused"], outcome["refused"]
