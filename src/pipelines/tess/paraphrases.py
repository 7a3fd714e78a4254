"""The open vocabulary of `tess_synth`: paraphrases of every cue group that the train split never uses.

The seen phrases are the generator bank of ``lexicon.BANK`` (5–7 per cue group, every split draws from
it). The paraphrases below are written for this benchmark: short grammars (a direction verb × an
intensity adverb, a noise noun × a change, ...) plus idioms, so each cue group has dozens of wordings
that share few or no n-grams with the bank. A share ``data.unseen_paraphrase_share`` of the TEST windows'
cue phrases is drawn from here (per phrase slot, seeded), so a bag of n-grams fitted on the train texts
cannot know the whole inventory, while a sentence encoder can still place e.g. "skyrocket" near "soar".

No phrase contains a hedge or negation word (the lexicon extractor's modifiers), and none equals a bank
phrase (``tests/methods/test_tess.py`` checks both)."""

from __future__ import annotations

from functools import lru_cache

_UP = ["climb", "rise", "gain", "advance", "move higher", "push upward", "head higher", "go up"]
_DOWN = ["fall", "decline", "drop", "slide", "retreat", "lose ground", "head lower", "go down"]
_MILD = ["slightly", "modestly", "a touch", "marginally", "gently", "a bit", "by a small amount", "somewhat"]
_STRONG = [
    "sharply",
    "steeply",
    "dramatically",
    "massively",
    "in a big way",
    "by a wide margin",
    "at a rapid clip",
    "forcefully",
]

_NOISE = ["swings", "fluctuations", "noise", "jitter", "variability", "volatility"]
_NOISE_CHANGE = {
    "MUCH-CALMER": ["shrink dramatically", "all but vanish", "drop to a fraction of normal", "fade almost entirely"],
    "CALMER": ["shrink a little", "ease somewhat", "narrow modestly", "soften slightly"],
    "SAME": ["stay about the same", "remain normal", "stay in the usual range", "hold at typical levels"],
    "CHOPPIER": ["widen somewhat", "pick up a bit", "increase modestly", "grow a little"],
    "MUCH-CHOPPIER": ["widen dramatically", "more than double", "increase enormously", "grow explosively"],
}

_IDIOMS: dict[str, list[str]] = {
    # shift
    "STRONG-RISE": [
        "skyrocket",
        "shoot up",
        "go through the roof",
        "take off",
        "balloon",
        "explode higher",
        "post a huge gain",
        "zoom higher",
        "blast upward",
    ],
    "MILD-RISE": ["tilt upward", "firm up a touch", "pick up slightly", "lift a little", "grind a bit higher"],
    "STABLE": [
        "stay put",
        "go nowhere",
        "tread water",
        "flatline",
        "stay range bound",
        "barely move",
        "mark time",
        "stand still",
        "show little change",
        "stay near current levels",
        "keep to the same level",
        "stay where it is",
        "hold its ground",
        "stay pinned",
        "idle",
    ],
    "MILD-DROP": ["soften", "weaken a touch", "give back a little", "sag slightly", "dip a little"],
    "STRONG-DROP": [
        "crater",
        "fall off a cliff",
        "tank",
        "cave in",
        "go into free fall",
        "dive",
        "post a huge loss",
        "plummet",
        "sell off heavily",
    ],
    # vol
    "MUCH-CALMER": [
        "go completely still",
        "become extremely smooth",
        "turn almost motionless",
        "go dead quiet",
        "become serene",
    ],
    "CALMER": ["get a bit smoother", "show less jitter", "turn a little quieter", "become somewhat more orderly"],
    "SAME": ["behave normally", "show its customary jitter", "be as noisy as before", "keep its regular texture"],
    "CHOPPIER": ["get a bit bumpier", "become somewhat erratic", "show more jitter", "turn a little shaky"],
    "MUCH-CHOPPIER": [
        "go haywire",
        "lurch violently",
        "become extremely erratic",
        "be all over the place",
        "gyrate violently",
    ],
    # shape
    "ASCEND": [
        "march higher",
        "step up gradually",
        "keep climbing",
        "rise in a straight line",
        "move up consistently",
        "build higher bit by bit",
        "follow an upward staircase",
        "head up at an even pace",
        "ascend smoothly",
        "slope upward",
    ],
    "DESCEND": [
        "keep sliding",
        "step down gradually",
        "decline consistently",
        "drift lower bit by bit",
        "follow a downward staircase",
        "erode steadily",
        "move down in a straight line",
        "descend smoothly",
        "slope downward",
        "head down at an even pace",
    ],
    "PEAK": [
        "rise to a high and come back",
        "form a hump",
        "climb to a top then slide",
        "go up before turning down",
        "arc up and back down",
        "hit a high then give it back",
        "reach a summit and descend",
        "make an inverted V",
    ],
    "TROUGH": [
        "fall to a low and come back",
        "form a V",
        "sink before recovering",
        "go down before turning up",
        "hit a low then climb back",
        "carve out a bottom then lift",
        "make a U turn from a low",
        "reach a floor and climb",
    ],
    "OSCILLATE": [
        "swing back and forth",
        "alternate up and down",
        "wave around",
        "go up and down repeatedly",
        "move in a sawtooth",
        "cycle between highs and lows",
        "ping pong",
        "yo yo",
        "chop back and forth",
        "wiggle",
    ],
    # lag: timing
    "EARLY": [
        "at once",
        "instantly",
        "from the first step",
        "in the opening hours",
        "right at the beginning",
        "early on",
        "from the outset",
        "at the very start",
        "straight off",
    ],
    "MID": [
        "partway through",
        "in the middle stretch",
        "about halfway in",
        "in the central part of the window",
        "once half the period has passed",
        "at the midpoint",
        "in the middle of the window",
    ],
    "LATE": [
        "near the finish",
        "in the final stretch",
        "toward the close of the window",
        "at the very end",
        "in the last few steps",
        "only at the end",
        "as the period winds down",
        "late in the game",
    ],
    # lag: persistence
    "FADE": [
        "before fading away",
        "only briefly",
        "for a short while",
        "in a passing way",
        "before wearing off",
        "transiently",
        "for a fleeting spell",
        "before dying out",
    ],
    "PERSIST": [
        "and then stay there",
        "for an extended time",
        "permanently",
        "with staying power",
        "in a sticky way",
        "for the rest of the window",
        "lastingly",
        "for the foreseeable future",
    ],
    "DIFFUSE": [
        "at some unclear point",
        "in a spread out way",
        "gradually across the window",
        "at a vague moment",
        "evenly over the horizon",
        "at an uncertain time",
        "all over the window",
        "in a smeared out fashion",
    ],
}


@lru_cache(maxsize=1)
def open_bank() -> dict[str, tuple[str, ...]]:
    """Unseen paraphrases per cue group (the keys of ``lexicon.BANK``), deduplicated, in a fixed order."""
    from pipelines.tess.lexicon import BANK

    grammar = {
        "STRONG-RISE": [f"{v} {a}" for v in _UP for a in _STRONG],
        "MILD-RISE": [f"{v} {a}" for v in _UP for a in _MILD],
        "STRONG-DROP": [f"{v} {a}" for v in _DOWN for a in _STRONG],
        "MILD-DROP": [f"{v} {a}" for v in _DOWN for a in _MILD],
        **{lab: [f"see its {n} {c}" for n in _NOISE for c in changes] for lab, changes in _NOISE_CHANGE.items()},
    }
    out = {}
    for group in BANK:
        seen = set(BANK[group])
        phrases = [*_IDIOMS[group], *grammar.get(group, [])]
        out[group] = tuple(dict.fromkeys(ph for ph in phrases if ph not in seen))
    return out
