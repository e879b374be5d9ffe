"""Device-only: the Gluon CLIP gradient block at 32k, launched three times (for a profiler's one launch)."""
import os, sys
import torch
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from diag_gluon_grad import FirstBlock
blk = FirstBlock(int(sys.argv[1]) if len(sys.argv) > 1 else 32768, 768)
p = blk.out()
for _ in range(3):
    blk.gluon(p)
torch.cuda.synchronize()
print("done")
