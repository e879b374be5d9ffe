"""Temporary (this experiment's commit only): the op's CLIP and SigLIP forward + backward at one B with the Gluon
gradient blocks launched with PDL mode 0, 1 and 2 (gluon_kernels' ``pdl``), compared: loss and gradients
equal to mode 0's (d scale to the order of its atomic sums)."""
import sys

import torch

sys.path.insert(0, ".")
from infclip.ops import contrastive_loss
from infclip.ops import contrastive_loss_triton as tri

b = int(sys.argv[1]) if len(sys.argv) > 1 else 32768
torch.manual_seed(0)
img = torch.nn.functional.normalize(torch.randn(b, 768, device="cuda"), dim=-1).bfloat16()
txt = torch.nn.functional.normalize(img.float() + 0.5 * torch.randn(b, 768, device="cuda"), dim=-1).bfloat16()
for loss in ("clip", "siglip"):
    out = {}
    for mode in (0, 1, 2):
        tri._GLUON["kw"] = {"pdl": mode}
        tri._GLUON_SIGLIP["kw"] = {"pdl": mode}
        i, t = img.clone().requires_grad_(), txt.clone().requires_grad_()
        s = torch.full((1,), 20.0, device="cuda", requires_grad=True)
        bias = torch.full((1,), -5.0, device="cuda", requires_grad=True) if loss == "siglip" else None
        val = contrastive_loss(i, t, s, bias, loss=loss, impl="triton", graph_max_batch=0)
        val.backward()
        torch.cuda.synchronize()
        out[mode] = (val.detach(), i.grad, t.grad, s.grad)
    for mode in (1, 2):
        same = [torch.equal(x, y) for x, y in zip(out[mode][:3], out[0][:3])]
        ds = (out[mode][3] - out[0][3]).abs().item() / out[0][3].abs().item()
        print(f"B={b} {loss} pdl {mode}: loss, d_img, d_txt equal to pdl 0: {same}, d scale relative {ds:.1e}", flush=True)
tri._GLUON["kw"] = {}
tri._GLUON_SIGLIP["kw"] = {}
