"""Noun / adjective / other tags of caption words, for ARO's order shuffles and the attacks' vocabulary: spaCy
and NLTK when they are installed (ARO's own tools), else word lists and a regex tokenizer."""
from __future__ import annotations

import functools
import logging
import re

__all__ = ["OrderTagger", "order_tagger", "WORD_LISTS"]

log = logging.getLogger("hardrank.suites")

# The reference tags words with spaCy's en_core_web_sm (Penn tags NN* = noun, JJ* = adjective) and
# tokenizes the trigram shuffles with nltk.word_tokenize. When spaCy and its English model are installed
# (`pip install spacy` and its en_core_web_sm package), hardrank uses them as the reference does; when
# they are not, nouns and adjectives are approximated with word lists: a closed-class list (articles,
# prepositions, pronouns, conjunctions, auxiliaries, numbers) and common caption verbs are "other";
# -ing/-ed/-ly words are "other"; listed or suffix-matched adjectives are adjectives; every other
# alphabetic word is a noun. Trigrams use nltk.word_tokenize when nltk and its punkt data are installed,
# else a regex tokenizer. Each result records which was used (suite_meta.pos_tagger / trigram_tokenizer).
# The shuffles themselves follow the reference exactly.
_CLOSED = frozenset("""
a an the this that these those some any each every all both either neither no another other such its
his her their our my your it he she they we i you him them us me what which who whom whose there here
of in on at by for with without from to into onto over under above below near beside besides behind
between among around across along through toward towards up down off out about against after before
during inside outside upon within beneath underneath past via like than as per
and or but nor so yet if then because although though while when where whether
is are was were be been being am have had having do does did doing can could will would shall
should may might must not very too also just only still even quite really almost
one two three four five six seven eight nine ten eleven twelve several many few lots lot much more
most less least
sits sit stands stand holds hold rides ride walks walk looks look plays play eats eat flies fly lays
lay lies lie waits wait carries carry runs run sleeps sleep uses use wears wear shows show takes take
has makes make goes go gets get watches watch talks talk swings swing throws throw hits hit catches
catch drives drive pulls pull leans lean hangs hang grazes graze rests rest surfs surf skis ski
""".split())
_ADJECTIVES = frozenset("""
red orange yellow green blue purple pink brown black white gray grey silver gold golden dark light
bright colorful big small large little tiny huge giant tall short long high low wide narrow thick thin
old new young fresh ripe empty full open closed wooden metal plastic glass clean dirty wet dry hot cold
warm cool busy crowded sunny cloudy snowy grassy sandy rocky shiny fluffy furry striped spotted
pretty beautiful cute ugly nice good bad great fancy modern antique vintage different same various
single double multiple whole
""".split())
_ADJ_SUFFIXES = ("ful", "ous", "ive", "able", "ible", "ish", "less")
_ING_ED_NOUNS = frozenset("building ceiling clothing painting railing awning evening morning wedding "
                          "frosting icing topping stuffing pudding dumpling shed bed sled".split())
_TOKEN = re.compile(r"'\w+|\w+|[^\w\s]")
_PENN = {**dict.fromkeys(("NN", "NNS", "NNP", "NNPS"), "noun"), **dict.fromkeys(("JJ", "JJR", "JJS"), "adj")}


def _tokens(caption: str) -> list[str]:
    """Word / punctuation / clitic tokens (stands in for ``nltk.word_tokenize`` and spaCy's tokenizer)."""
    return _TOKEN.findall(caption)


def _tag(token: str) -> str:
    """"noun", "adj" or "other" (approximation, see above)."""
    w = token.lower()
    if not w.isalpha() or w in _CLOSED:
        return "other"
    if len(w) > 4 and w.endswith(("ing", "ed", "ly")) and w not in _ING_ED_NOUNS:
        return "other"
    if w in _ADJECTIVES or (len(w) > 5 and w.endswith(_ADJ_SUFFIXES)):
        return "adj"
    return "noun"


class OrderTagger:
    """Tokens and noun / adjective / other tags for the order shuffles, and the trigram shuffles' tokens.

    ``nlp``: a spaCy pipeline with a tagger (``spacy.load("en_core_web_sm")``, as ARO's code), or None
    for the word lists; ``word_tokenize``: ``nltk.word_tokenize`` or None for the regex tokenizer.
    ``order_tagger()`` picks what is installed."""

    def __init__(self, nlp=None, word_tokenize=None, name: str | None = None, tokenizer: str | None = None):
        self.nlp, self.word_tokenize = nlp, word_tokenize
        self.name = name or ("spacy" if nlp is not None else "word lists (spaCy's en_core_web_sm is not installed)")
        self.tokenizer = tokenizer or ("nltk.word_tokenize" if word_tokenize is not None
                                       else "regex (nltk and its punkt data are not installed)")

    def tag_many(self, captions: list[str]) -> list[tuple[list[str], list[str]]]:
        """(tokens, tags) per caption; tags are "noun", "adj" or "other"."""
        if self.nlp is None:
            return [(toks, [_tag(t) for t in toks]) for toks in map(_tokens, captions)]
        return [([t.text for t in doc], [_PENN.get(t.tag_, "other") for t in doc])
                for doc in self.nlp.pipe(captions, batch_size=256)]

    def trigram_tokens(self, caption: str) -> list[str]:
        return self.word_tokenize(caption) if self.word_tokenize is not None else _tokens(caption)


WORD_LISTS = OrderTagger()


@functools.lru_cache(maxsize=1)
def order_tagger() -> OrderTagger:
    """spaCy's en_core_web_sm and nltk.word_tokenize when they are installed (ARO's own tools), else the
    word lists and the regex tokenizer. Loaded once per process."""
    nlp = name = None
    try:
        import spacy

        nlp = spacy.load("en_core_web_sm", exclude=["parser", "ner", "lemmatizer"])
        name = f"spacy {spacy.__version__} en_core_web_sm {nlp.meta.get('version', '?')}"
    except (ImportError, OSError) as exc:
        log.info("ARO order tasks: word-list tagger (%s)", exc)
        nlp = None
    word_tokenize = None
    try:
        import nltk

        nltk.word_tokenize("a test.")  # needs the punkt data, which nltk does not ship
        word_tokenize = nltk.word_tokenize
    except (ImportError, LookupError) as exc:
        log.info("ARO trigram shuffles: regex tokenizer (%s)", exc)
    return OrderTagger(nlp, word_tokenize, name=name)
