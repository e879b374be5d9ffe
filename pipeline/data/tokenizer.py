"""Text tokenizer: a byte-level BPE trained on the shards' captions, or any local HF tokenizer.

Design: nothing is downloaded. By default the project trains a lower-cased byte-level BPE with
the ``tokenizers`` library on the training captions and saves it as a ``PreTrainedTokenizerFast``
folder, so ``transformers.AutoTokenizer.from_pretrained(folder)`` loads it offline and it can be
stored with the run. Special tokens get the first ids: ``<|pad|>`` = 0, ``<|endoftext|>``
(EOS) = 1, ``<|startoftext|>`` (BOS) = 2.

EOS pooling: transformers' ``CLIPTextTransformer`` pools the hidden state at the FIRST position
whose id equals ``config.eos_token_id``, except when ``eos_token_id == 2``, a legacy value for
which it pools at ``input_ids.argmax(-1)`` (the highest id, right only for OpenAI's vocabulary).
Hence EOS here is id 1, never 2, and :func:`tokenize` always ends every row with EOS (truncating
the text, never the EOS). The model's ``CLIPTextConfig`` must get ``vocab_size``,
``pad_token_id``, ``bos_token_id``, ``eos_token_id`` from :func:`special_token_ids`.

Limit: :func:`tokenize` builds ``[BOS] text [EOS] [PAD]...`` itself from the tokenizer's ids
without special tokens, so it works for any HF tokenizer that has an EOS token (BOS is optional;
a tokenizer without a pad token pads with EOS, as OpenAI's CLIP tokenizer does). Caption text is
encoded with ``split_special_tokens=True``: a caption that spells ``<|endoftext|>`` or
``<|pad|>`` gets those characters' ordinary tokens, never the EOS/PAD id, so the only EOS of a
row ends its caption (BPE training reads such text as text too, so its merges match).
A tokenizer whose BOS is its EOS (GPT-2 style) gets no BOS, rows ``text [EOS] [PAD]...``: a
leading EOS would be the first EOS, pooled before any text.

Called the HF way (``tok(texts)``, ``CLIPProcessor``, transformers' pipelines) the saved BPE
gives the same rows: :func:`with_clip_template` puts a ``TemplateProcessing`` post-processor
(``[BOS] $A [EOS]``) and truncation/padding to the context length into ``tokenizer.json``, so
``tok(texts, padding="max_length", truncation=True)`` equals :func:`tokenize` (transformers itself
pads or truncates only when asked; the ``tokenizers`` library applies the saved settings always);
it also stores ``split_special_tokens=True``, so text spelling a special token is text there too.

OpenCLIP's tokenizer (``data.tokenizer: "openclip"``, :func:`build_openclip_tokenizer`): OpenAI's
49,408-token BPE that ships inside ``open_clip_torch`` (``bpe_simple_vocab_16e6.txt.gz``), written as
an HF CLIP tokenizer folder whose rows equal ``open_clip.tokenize``'s: ``<|startoftext|>`` 49406,
text, ``<|endoftext|>`` 49407, padded with id 0 (``!``: a pad id that is also ordinary text stays in
the text). Limit: OpenCLIP cleans captions with ftfy and HTML unescaping before the BPE; the folder's
normalizer repeats what the ``tokenizers`` library can (Unicode NFC, curly quotes, f-ligatures, the
common HTML entities, whitespace, lower case), not ftfy's other repairs (mojibake, full-width forms).
"""

from __future__ import annotations

import gzip
import importlib.util
import itertools
import logging
import os
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from infclip.ops.config import ConfigError

from .tar_read import tar_members

__all__ = [
    "BOS_TOKEN",
    "EOS_TOKEN",
    "OPENCLIP_TOKENIZER",
    "PAD_TOKEN",
    "build_openclip_tokenizer",
    "ensure_tokenizer",
    "iter_shard_captions",
    "load_tokenizer",
    "special_token_ids",
    "tokenize",
    "train_bpe_tokenizer",
    "with_clip_template",
]

logger = logging.getLogger(__name__)

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|startoftext|>"
_SPECIALS = [PAD_TOKEN, EOS_TOKEN, BOS_TOKEN]  # ids 0, 1, 2: EOS must not be 2 (see header)


def train_bpe_tokenizer(texts: Iterable[str], out_dir: Union[str, Path], vocab_size: int = 4096,
                        context_length: int = 77, min_frequency: int = 2):
    """Train a lower-cased byte-level BPE on ``texts`` and save it to ``out_dir``.

    Args:
        texts: the training corpus (captions); an iterator is consumed once.
        out_dir: folder written with ``save_pretrained`` (``tokenizer.json``,
            ``tokenizer_config.json``, ``special_tokens_map.json``); written to a temporary
            sibling and renamed, so a concurrent reader never sees half a tokenizer.
        vocab_size: upper bound on the vocabulary (256 byte tokens + 3 special tokens + merges);
            a small corpus may give fewer. Read the real size from :func:`special_token_ids`.
        context_length: stored as ``model_max_length``.
    Returns:
        the loaded ``PreTrainedTokenizerFast``.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    min_vocab = 256 + len(_SPECIALS)
    if vocab_size < min_vocab:
        raise ValueError(f"vocab_size must be >= {min_vocab} (byte alphabet + special tokens), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase(), normalizers.Strip()])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    ids = [tok.token_to_id(t) for t in _SPECIALS]
    if ids != [0, 1, 2]:
        raise RuntimeError(f"special token ids came out as {ids}, expected [0, 1, 2]")
    fast = with_clip_template(PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS_TOKEN, eos_token=EOS_TOKEN,
                                                      pad_token=PAD_TOKEN, model_max_length=context_length),
                              context_length)
    return _save(fast, Path(out_dir))


def _save(fast, out_dir: Path):
    """Save ``fast`` to ``out_dir`` through a temporary sibling renamed into place (a concurrent
    reader never sees half a tokenizer) and load it back."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        fast.save_pretrained(str(tmp))
        try:
            os.replace(tmp, out_dir)
        except OSError:
            if not (out_dir / "tokenizer.json").is_file():  # not "another rank got there first"
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return load_tokenizer(out_dir)


OPENCLIP_TOKENIZER = "openclip"
"""``data.tokenizer`` value: OpenCLIP's BPE (:func:`build_openclip_tokenizer`) in the run's folder."""
_OPENCLIP_BPE = "bpe_simple_vocab_16e6.txt.gz"


def _bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's byte -> printable character map, in OpenCLIP's order (its first 512 vocabulary ids)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return dict(zip(bs, map(chr, cs)))


def openclip_bpe_path() -> Path:
    """OpenCLIP's BPE file inside the installed ``open_clip_torch`` (found, not imported: importing
    open_clip needs torchvision)."""
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"data.tokenizer '{OPENCLIP_TOKENIZER}' reads OpenCLIP's BPE from the open_clip_torch "
                          "package, which is not installed (pip install --no-deps open_clip_torch ftfy)")
    return Path(list(spec.submodule_search_locations)[0]) / _OPENCLIP_BPE


def _openclip_normalizer():
    """OpenCLIP's caption cleaning as far as ``tokenizers`` normalizers go (see the header)."""
    from tokenizers import Regex, normalizers

    replace = [("\u2018", "'"), ("\u2019", "'"), ("\u201a", "'"), ("\u201b", "'"), ("\u201c", '"'),
               ("\u201d", '"'), ("\u201e", '"'), ("\u201f", '"'), ("\ufb00", "ff"), ("\ufb01", "fi"),
               ("\ufb02", "fl"), ("\ufb03", "ffi"), ("\ufb04", "ffl")]
    # html.unescape runs twice in OpenCLIP: "&amp;amp;" is "&" there too
    entities = [("&amp;", "&"), ("&amp;", "&"), ("&quot;", '"'), ("&#39;", "'"), ("&apos;", "'"), ("&lt;", "<"),
                ("&gt;", ">"), ("&nbsp;", " ")]
    steps = [normalizers.NFC()] + [normalizers.Replace(a, b) for a, b in replace + entities]
    return normalizers.Sequence(steps + [normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip(),
                                         normalizers.Lowercase()])


def build_openclip_tokenizer(out_dir: Union[str, Path], context_length: int = 77,
                             bpe_path: Optional[Union[str, Path]] = None):
    """Write OpenCLIP's tokenizer as an HF CLIP tokenizer folder and load it: the vocabulary and
    merges of ``bpe_path`` (default: the installed open_clip_torch's), OpenCLIP's pre-tokenizing
    pattern and ``</w>`` word ends, ``<start_of_text>`` / ``<end_of_text>`` renamed
    ``<|startoftext|>`` / ``<|endoftext|>`` (ids 49406 / 49407), pad ``!`` (id 0, OpenCLIP's
    padding), :func:`with_clip_template`'s rows. :func:`tokenize` with it gives ``open_clip.tokenize``'s
    ids (see the header for the cleaning it cannot repeat)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path = Path(bpe_path) if bpe_path is not None else openclip_bpe_path()
    lines = gzip.open(path).read().decode("utf-8").split("\n")
    merges = [tuple(line.split()) for line in lines[1: 49152 - 256 - 2 + 1]]  # OpenCLIP's slice of the file
    chars = list(_bytes_to_unicode().values())
    words = chars + [c + "</w>" for c in chars] + ["".join(m) for m in merges] + [BOS_TOKEN, EOS_TOKEN]
    bpe = models.BPE(vocab={w: i for i, w in enumerate(words)}, merges=merges, end_of_word_suffix="</w>",
                     continuing_subword_prefix="")
    tok = Tokenizer(bpe)
    tok.normalizer = _openclip_normalizer()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""),
                             behavior="removed", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Replace("</w>", " "), decoders.Strip(" ", 0, 1)])
    tok.add_special_tokens([BOS_TOKEN, EOS_TOKEN])
    fast = with_clip_template(PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS_TOKEN, eos_token=EOS_TOKEN,
                                                      pad_token="!", model_max_length=context_length),
                              context_length)
    return _save(fast, Path(out_dir))


def with_clip_template(tokenizer, context_length: int):
    """A copy of ``tokenizer`` (a fast HF tokenizer) whose ``tokenizers`` backend adds the special
    tokens, truncates and pads the way :func:`tokenize` does: a ``TemplateProcessing``
    post-processor ``[BOS] $A [EOS]`` (``[BOS] $A [EOS] $B [EOS]`` for pairs; no BOS when
    :func:`special_token_ids` gives none), truncation of the text to ``context_length`` tokens in
    all (the EOS is kept) and padding with the pad token (EOS if none) to ``context_length``, all
    stored in its ``tokenizer.json``; ``model_max_length`` is ``context_length``, and ``split_special_tokens`` is
    on (saved in ``tokenizer_config.json``), so text that spells a special token is encoded as text,
    as :func:`tokenize` does.

    ``copy(texts, padding="max_length", truncation=True)`` then gives :func:`tokenize`'s ids and
    mask, and ``copy(texts)`` the rows without padding; :func:`tokenize` itself encodes without
    special tokens, so its output does not change.
    """
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    if not getattr(tokenizer, "is_fast", False) or not hasattr(tokenizer, "backend_tokenizer"):
        raise TypeError(f"with_clip_template needs a fast (tokenizers-backed) tokenizer, got {type(tokenizer).__name__}")
    ids = special_token_ids(tokenizer)
    eos, pad, bos = ids["eos_token_id"], ids["pad_token_id"], ids["bos_token_id"]
    eos_tok, bos_tok = tokenizer.convert_ids_to_tokens(eos), tokenizer.convert_ids_to_tokens(bos) if bos is not None else None
    pad_tok = tokenizer.convert_ids_to_tokens(pad)
    if context_length < (3 if bos is not None else 2):
        raise ValueError(f"context_length {context_length} leaves no room for text between BOS and EOS")
    head = f"{bos_tok} " if bos is not None else ""
    specials = [(eos_tok, eos)] + ([(bos_tok, bos)] if bos is not None else [])
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.post_processor = processors.TemplateProcessing(
        single=f"{head}$A {eos_tok}", pair=f"{head}$A {eos_tok} $B:1 {eos_tok}:1", special_tokens=specials)
    backend.enable_truncation(max_length=context_length)
    backend.enable_padding(length=context_length, pad_id=pad, pad_token=pad_tok)
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=tokenizer.bos_token, eos_token=eos_tok,
                                   pad_token=pad_tok, model_max_length=context_length, split_special_tokens=True)


def load_tokenizer(path: Union[str, Path]):
    """Load a local HF tokenizer folder (offline) and check it has what :func:`tokenize` needs."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer folder not found: {path}")
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if tok.eos_token_id is None:
        raise ValueError(f"tokenizer in {path} has no EOS token; CLIP's text tower pools at EOS")
    if tok.bos_token_id is not None and tok.bos_token_id == tok.eos_token_id:
        logger.info("tokenizer in %s: its BOS is its EOS (%r, id %d); rows get no BOS (text [EOS] [PAD]...), so "
                    "the first EOS, where the text tower pools, ends the caption", path, tok.eos_token,
                    tok.eos_token_id)
    return tok


def special_token_ids(tokenizer) -> Dict[str, Optional[int]]:
    """``{"vocab_size", "pad_token_id", "bos_token_id", "eos_token_id"}`` for ``CLIPTextConfig``.

    ``vocab_size`` is ``len(tokenizer)`` (base vocabulary plus added tokens); ``pad_token_id``
    falls back to EOS when the tokenizer has no pad token (that is what :func:`tokenize` pads
    with); ``bos_token_id`` is None when the tokenizer has no BOS or its BOS is its EOS (GPT-2
    style): then no BOS is prepended, since a leading EOS would be the one the text tower pools.
    """
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id != eos else None
    return {"vocab_size": len(tokenizer), "pad_token_id": pad, "bos_token_id": bos, "eos_token_id": eos}


def tokenize(tokenizer, texts: Sequence[str], context_length: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Tokenize to fixed length: rows are ``[BOS] tokens [EOS] [PAD]...``.

    Texts longer than ``context_length`` lose their last tokens, never the EOS (the text tower
    pools there). The text is encoded with ``split_special_tokens=True``, so a caption that spells
    a special token (``"<|endoftext|>"``) gets that string's ordinary tokens, never its id; should
    the text still give the EOS, PAD or BOS id (a tokenizer whose unk token is its EOS), those ids
    are dropped from it, with a warning (a PAD id that is also ordinary text, OpenCLIP's ``!``,
    stays). So each row holds one EOS, at the caption's end. No BOS
    when :func:`special_token_ids` gives none (also when BOS is EOS). Returns ``(input_ids,
    attention_mask)``, both ``LongTensor[N, context_length]``; the mask is 1 from the first token
    (BOS, if any) to EOS inclusive, 0 on padding.
    """
    ids = special_token_ids(tokenizer)
    eos, pad, bos = ids["eos_token_id"], ids["pad_token_id"], ids["bos_token_id"]
    prefix = [bos] if bos is not None else []
    room = context_length - len(prefix) - 1
    if room < 1:
        raise ValueError(f"context_length {context_length} leaves no room for text between BOS and EOS")
    texts = list(texts)
    input_ids = torch.full((len(texts), context_length), pad, dtype=torch.long)
    mask = torch.zeros((len(texts), context_length), dtype=torch.long)
    if not texts:
        return input_ids, mask
    # truncating here (not only below) keeps long captions cheap and silences HF's length warning
    # split_special_tokens: caption text that spells a special token ("<|endoftext|>") is text, not that token
    encoded = tokenizer(texts, add_special_tokens=False, truncation=True, max_length=room,
                        split_special_tokens=True)["input_ids"]
    structural = {eos} | ({bos} if bos is not None else set())
    if _pad_is_structural(tokenizer, pad):
        structural.add(pad)
    for row, toks in enumerate(encoded):
        toks = list(toks[:room])
        if structural.intersection(toks):
            _warn_structural_ids_in_text(tokenizer, structural.intersection(toks))
            toks = [t for t in toks if t not in structural]
        seq = prefix + toks + [eos]
        input_ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, : len(seq)] = 1
    return input_ids, mask


def _pad_is_structural(tokenizer, pad: int) -> bool:
    """False when the pad id is also ordinary text (OpenCLIP pads with id 0, ``!``): its spelling
    encodes to itself, so it stays in the captions."""
    spelled = tokenizer(tokenizer.convert_ids_to_tokens(pad), add_special_tokens=False,
                        split_special_tokens=True)["input_ids"]
    return list(spelled) != [pad]


_WARNED_STRUCTURAL: set = set()


def _warn_structural_ids_in_text(tokenizer, found) -> None:
    """Warn once per tokenizer that its text encoding gave EOS/PAD/BOS ids (dropped from the text)."""
    if id(tokenizer) in _WARNED_STRUCTURAL:
        return
    _WARNED_STRUCTURAL.add(id(tokenizer))
    logger.warning("tokenizer %s encoded caption text to the special id(s) %s even with split_special_tokens "
                   "(e.g. its unk token is its EOS, as CLIP's is); dropped from the text so that the rows keep "
                   "one EOS, at the caption's end", type(tokenizer).__name__, sorted(found))


#: A caption member larger than this is passed over unread by the tokenizer-training pass (a
#: member of gigabytes would otherwise be read whole into memory).
MAX_CAPTION_BYTES = 1 << 20


def iter_shard_captions(urls: Sequence[str], caption_key: str = "txt", max_captions: Optional[int] = None,
                        broken: Optional[List[str]] = None) -> Iterator[str]:
    """Stream the caption members of tar shards, in order, without reading image bytes' content.

    Only members whose extension (after the first dot of the basename) is ``caption_key`` are
    read; everything else is skipped over by the tar reader. Unreadable captions are skipped. A
    shard that cannot be read as a tar (empty, cut short, not a tar, unreadable) is skipped with a
    warning naming it, as the training loader skips it; its captions read before the damage are
    kept. Each skipped shard's URL is appended to ``broken`` when given. A caption member larger
    than :data:`MAX_CAPTION_BYTES` is passed over unread, named in a warning.
    """
    from webdataset.gopen import gopen

    def is_caption(name: str) -> bool:
        base = name.rsplit("/", 1)[-1]
        return "." in base and base.split(".", 1)[1].lower() == caption_key

    count = 0
    for url in urls:
        def too_big(name: str, size: int, url: str = url) -> None:
            logger.warning("tokenizer training: skipping %s in %s: %d bytes, more than a caption's limit of %d",
                           name, url, size, MAX_CAPTION_BYTES)

        try:
            with gopen(url, "rb") as raw:
                for _, data in tar_members(raw, is_caption, MAX_CAPTION_BYTES, too_big):
                    try:
                        text = data.decode("utf-8").strip()
                    except UnicodeDecodeError:
                        continue
                    if text:
                        yield text
                        count += 1
                        if max_captions is not None and count >= max_captions:
                            return
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            logger.warning("tokenizer training: skipping broken shard %s (%s)", url,
                           str(exc).strip() or type(exc).__name__)
            if broken is not None:
                broken.append(url)


def ensure_tokenizer(data_cfg, shards: Optional[Sequence[str]], out_dir: Union[str, Path],
                     context_length: int = 77):
    """The run's tokenizer: the configured folder, an earlier run's copy, or a freshly trained BPE.

    Args:
        data_cfg: :class:`pipeline.data.config.DataConfig` (uses ``tokenizer``, ``vocab_size``,
            ``tokenizer_train_captions``, ``caption_key``).
        shards: the training shards' URLs, expanded and present (e.g.
            :func:`pipeline.data.shard_urls.prepare_shards`'s list), whose captions train the BPE; needed
            only when there is no tokenizer to load.
        out_dir: the tokenizer folder inside the run directory (e.g. ``run_dir/tokenizer``).
            When ``data_cfg.tokenizer`` is null and it already holds a tokenizer (a resumed
            run), that one is loaded, so the vocabulary never changes under a checkpoint.
        context_length: the text tower's context length (stored as ``model_max_length``).
    Returns:
        a ``PreTrainedTokenizerFast`` (or whatever ``AutoTokenizer`` loads for the folder).

    Training is deterministic for the same captions, so ranks that each call this get the same
    vocabulary; on a shared file system call it on rank 0 first, then on the others after a
    barrier, to train once.
    """
    out_dir = Path(out_dir)
    if data_cfg.tokenizer == OPENCLIP_TOKENIZER:
        if (out_dir / "tokenizer.json").is_file():
            return load_tokenizer(out_dir)
        return build_openclip_tokenizer(out_dir, context_length)
    if data_cfg.tokenizer:
        return load_tokenizer(data_cfg.tokenizer)
    if (out_dir / "tokenizer.json").is_file():
        return load_tokenizer(out_dir)
    if isinstance(shards, str):
        raise TypeError(f"ensure_tokenizer takes the training shards as a list of URLs, got the string {shards!r} "
                        "(pipeline.data.shard_urls.expand_urls expands a brace pattern)")
    if not shards:
        raise ConfigError(f"no tokenizer to train: data.tokenizer is unset, {out_dir} holds none, and no "
                          "training shards were given")
    urls = list(shards)
    broken: List[str] = []
    texts = iter_shard_captions(urls, data_cfg.caption_key, data_cfg.tokenizer_train_captions, broken)
    first = next(texts, None)
    if first is None:
        detail = f" ({len(broken)} of them broken: {', '.join(broken[:3])})" if broken else ""
        raise ConfigError(f"no '{data_cfg.caption_key}' captions to train the tokenizer on in the {len(urls)} "
                          f"training shard(s){detail}")
    logger.info("training a byte-level BPE (vocab <= %d) on captions of %d shard(s) -> %s",
                data_cfg.vocab_size, len(urls), out_dir)
    tok = train_bpe_tokenizer(itertools.chain([first], texts), out_dir, vocab_size=data_cfg.vocab_size,
                              context_length=context_length)
    if broken:
        logger.warning("tokenizer trained without %d broken shard(s) of %d: %s", len(broken), len(urls),
                       ", ".join(broken[:5]) + (f" (+{len(broken) - 5} more)" if len(broken) > 5 else ""))
    return tok
