"""Write OpenCLIP's tokenizer as an HF CLIP tokenizer folder: ``python launch/openclip_tokenizer.py --out DIR``.

The BPE that OpenCLIP's models were trained with (``bpe_simple_vocab_16e6.txt.gz``, from the installed
open_clip_torch, or ``--bpe FILE``), with OpenCLIP's rows (ids equal to ``open_clip.tokenize``'s):
a folder for ``data.tokenizer``, ``--tokenizer`` or transformers' ``AutoTokenizer``. A run can also
name it directly with ``data.tokenizer: "openclip"`` (written to the run's ``tokenizer/``).
Thin CLI over :func:`pipeline.data.tokenizer.build_openclip_tokenizer`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from infclip.pipeline.data.tokenizer import build_openclip_tokenizer  # noqa: E402


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--context-length", type=int, default=77, help="tokens per row (OpenCLIP's 77)")
    parser.add_argument("--bpe", default=None, help="the BPE file (default: the installed open_clip_torch's)")
    parser.add_argument("--debug", action="store_true", help="show the traceback of user errors too")
    args = parser.parse_args(argv)
    from infclip.pipeline.errors import exit_on_user_error

    with exit_on_user_error("openclip_tokenizer.py", args.debug):
        tok = build_openclip_tokenizer(args.out, args.context_length, args.bpe)
    sys.stdout.write(f"{args.out}: {len(tok)} tokens, BOS {tok.bos_token_id}, EOS {tok.eos_token_id}, "
                     f"pad {tok.pad_token_id}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
