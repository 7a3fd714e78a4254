"""The four TESS primitives (paper §3: shift, volatility, shape, lag), their labels, and the phrase banks.

The generator renders texts from the full banks; the extractor's cue lexicon knows only a fixed
share (``lexicon_overlap``) of each bank, so extraction is not a tautology (card: Pitfalls)."""

from __future__ import annotations

import random

PRIMITIVES = ("shift", "vol", "shape", "lag")
LABELS = {
    "shift": ["STRONG-DROP", "MILD-DROP", "STABLE", "MILD-RISE", "STRONG-RISE"],
    "vol": ["MUCH-CALMER", "CALMER", "SAME", "CHOPPIER", "MUCH-CHOPPIER"],
    "shape": ["ASCEND", "DESCEND", "PEAK", "TROUGH", "OSCILLATE"],
    "lag": ["EARLY-FADE", "EARLY-PERSIST", "MID-FADE", "MID-PERSIST", "LATE", "DIFFUSE"],
}
DEFAULT = {"shift": "STABLE", "vol": "SAME", "shape": "OSCILLATE", "lag": "DIFFUSE"}
MAX_LABELS = max(len(v) for v in LABELS.values())

# Phrase banks per "cue group". A label of shift/vol/shape is one group; a lag label combines a timing
# group with a persistence group (EARLY-FADE = "early" + "fade").
BANK: dict[str, list[str]] = {
    # shift
    "STRONG-RISE": ["surge", "soar", "jump", "rocket higher", "spike up", "rally hard", "leap"],
    "MILD-RISE": ["edge up", "inch higher", "drift up", "tick higher", "creep up", "firm a little", "nudge up"],
    "STABLE": ["hold steady", "stay flat", "move sideways", "remain level", "hover in place", "stay unchanged"],
    "MILD-DROP": ["edge down", "inch lower", "drift down", "tick lower", "slip a little", "ease off", "nudge down"],
    "STRONG-DROP": ["plunge", "tumble", "crash", "sink hard", "collapse", "nosedive", "slump"],
    # vol
    "MUCH-CALMER": ["become very calm", "go quiet", "settle completely", "turn placid", "calm right down"],
    "CALMER": ["calm a bit", "grow less jumpy", "quiet somewhat", "steady slightly", "settle a little"],
    "SAME": ["keep its usual noise", "trade as usual", "keep normal swings", "show ordinary noise", "stay typical"],
    "CHOPPIER": ["get choppier", "grow jumpy", "turn restless", "become unsettled", "wobble more"],
    "MUCH-CHOPPIER": ["turn turbulent", "swing wildly", "become chaotic", "whipsaw", "thrash around"],
    # shape
    "ASCEND": ["climb steadily", "trend upward", "build up step by step", "ratchet up", "grind upward"],
    "DESCEND": ["fall steadily", "trend downward", "bleed lower", "ratchet down", "grind downward"],
    "PEAK": ["peak then ease", "top out and retreat", "spike then fade back", "crest then recede", "hump then settle"],
    "TROUGH": [
        "dip then rebound",
        "bottom out and recover",
        "sag then bounce",
        "slump then recover",
        "hollow then rise",
    ],
    "OSCILLATE": ["zigzag", "seesaw back and forth", "oscillate", "bob up and down", "flip flop"],
    # lag: timing
    "EARLY": ["immediately", "right away", "at the open", "straight away", "from the start"],
    "MID": ["midway through", "by mid period", "halfway through", "around the middle", "mid window"],
    "LATE": ["later this month", "toward the end", "late in the period", "near the close", "at the tail end"],
    # lag: persistence
    "FADE": ["temporarily", "briefly", "only for a moment", "in a short lived way", "fleetingly"],
    "PERSIST": ["for good", "in a lasting way", "persistently", "durably", "for the long haul"],
    "DIFFUSE": [
        "with no clear timing",
        "spread across the period",
        "diffusely",
        "without a distinct moment",
        "scattered over time",
    ],
}
# level-E cues (overall direction only) and their label groups
DIRECTION = {"up": ["higher overall"], "down": ["lower overall"], "flat": ["flat overall"]}
LAG_GROUPS = {
    "EARLY-FADE": ("EARLY", "FADE"),
    "EARLY-PERSIST": ("EARLY", "PERSIST"),
    "MID-FADE": ("MID", "FADE"),
    "MID-PERSIST": ("MID", "PERSIST"),
    "LATE": ("LATE",),
    "DIFFUSE": ("DIFFUSE",),
}
INTENSIFIERS = {"very", "sharply", "strongly", "significantly", "dramatically"}
HEDGES = {"may", "might", "could", "possibly", "perhaps"}
NEGATIONS = {"no", "not", "never", "without", "unlikely"}

DISTRACTORS = [
    "The quarterly meeting is scheduled for the second week of the month.",
    "Several analysts attended the regional conference in the capital city.",
    "The company renamed its logistics division after a long internal review.",
    "Weather reports mention heavy rain across the northern coastal areas.",
    "A new office opened downtown with room for two hundred employees.",
    "The committee published its minutes together with a short appendix.",
    "Local officials discussed road repairs during the evening session.",
    "The board welcomed two new members with backgrounds in engineering.",
    "Printed newsletters were mailed to subscribers on the usual schedule.",
    "The annual report includes photographs from the company archive.",
    "Staff training sessions will cover the updated safety guidelines.",
    "A panel of experts reviewed the proposal for the new warehouse.",
    "The cafeteria menu changed after feedback from many of the staff.",
    "Visitors toured the museum exhibit about the history of the port.",
    "The software team released documentation for the internal portal.",
    "An interview with the founder appeared in a weekend magazine.",
]


def known_phrases(overlap: float, seed: int = 1234) -> dict[str, list[str]]:
    """The extractor's share of each bank: a fixed, seeded subset of ceil(overlap * n) phrases."""
    rng = random.Random(seed)
    out = {}
    for group, phrases in BANK.items():
        k = max(1, round(overlap * len(phrases)))
        out[group] = sorted(rng.sample(phrases, k))
    out.update({f"DIR-{d}": p for d, p in DIRECTION.items()})
    return out
