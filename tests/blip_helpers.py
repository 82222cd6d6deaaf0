"""A tiny random BLIP retrieval model, saved as ``save_pretrained`` writes one, with a locally trained tokenizer."""
from __future__ import annotations

from pathlib import Path

import torch
from hf_helpers import save_processor
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    BlipConfig,
    BlipForImageTextRetrieval,
    BlipImageProcessor,
    BlipProcessor,
    PreTrainedTokenizerFast,
)

WORDS = ["a dog and a cat on the bus", "a man or a woman near a tree", "pizza horse boat car number",
         "zero one two three four five six seven eight nine ten eleven twelve", "a portrait of an officer in uniform"]


def make_blip(folder: Path, *, enc_token: bool = True, seed: int = 0, image_size: int = 32, layout: str = "5",
              **save) -> Path:
    """Save a tiny BlipForImageTextRetrieval into ``folder`` as users do: ``model.save_pretrained(folder, **save)``
    + ``BlipProcessor.save_pretrained(folder)`` (BLIP's image processor and a tokenizer), in transformers
    ``layout`` 5 or 4 (``hf_helpers.save_processor``)."""
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + (["[DEC]", "[ENC]"] if enc_token else [])
    tok.train_from_iterator(WORDS, trainers.WordPieceTrainer(vocab_size=120, special_tokens=special))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[
        ("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")
    cfg = BlipConfig(
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": image_size, "patch_size": 16},
        text_config={"vocab_size": tok.get_vocab_size(), "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 64,
                     "encoder_hidden_size": 32, "pad_token_id": tok.token_to_id("[PAD]"),
                     "bos_token_id": tok.token_to_id("[CLS]"), "sep_token_id": tok.token_to_id("[SEP]")},
        image_text_hidden_size=16)
    torch.manual_seed(seed)
    net = BlipForImageTextRetrieval(cfg)
    with torch.no_grad():  # BLIP's init leaves near-constant features: spread every weight so items differ
        for p in net.parameters():
            p.normal_(1.0 if p.ndim == 1 and p.shape[0] == 32 else 0.0, 0.3)
    net.save_pretrained(folder, **save)
    image = BlipImageProcessor(size={"height": image_size, "width": image_size})
    save_processor(folder, BlipProcessor(image_processor=image, tokenizer=fast), layout)
    return folder
