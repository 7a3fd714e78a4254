"""Inputs of `medtpe`: a general-domain corpus for the base BPE (docstrings of the Python standard library,
read with `ast`, never imported), and a seeded synthetic EHR generator whose stays have realistic code
co-occurrence (conditions bring their diagnoses, labs and drugs together) and hidden risk models for the
two prediction tasks (in-hospital mortality, long stay). User data under --env=full: see the README."""

from __future__ import annotations

import ast
import json
import math
import sysconfig
from pathlib import Path

import numpy as np
import pandas as pd

from pipelines.core.api import TableSchema, read_user_file
from pipelines.medtpe.params import Params

QUESTIONS = {
    "mortality": "Question: Will the patient die during this hospital stay? Answer yes or no.\nAnswer:",
    "long_stay": "Question: Will the patient stay in hospital for more than 7 days? Answer yes or no.\nAnswer:",
}
ANSWERS = {1: " yes", 0: " no"}

# name: (unit, low, high, decimals, direction of the dangerous side: +1 high, -1 low)
LABS = {
    "Creatinine": ("mg/dL", 0.6, 1.2, 1, +1),
    "Lactate": ("mmol/L", 0.5, 2.0, 1, +1),
    "White Blood Cells": ("K/uL", 4.0, 11.0, 1, +1),
    "Hemoglobin": ("g/dL", 12.0, 16.0, 1, -1),
    "Potassium": ("mEq/L", 3.5, 5.0, 1, +1),
    "Sodium": ("mEq/L", 135, 145, 0, -1),
    "Glucose": ("mg/dL", 70, 140, 0, +1),
    "Urea Nitrogen": ("mg/dL", 7, 20, 0, +1),
    "NT-proBNP": ("pg/mL", 0, 300, 0, +1),
    "Troponin T": ("ng/mL", 0.0, 0.01, 2, +1),
    "Platelet Count": ("K/uL", 150, 400, 0, -1),
    "Bilirubin, Total": ("mg/dL", 0.1, 1.2, 1, +1),
    "pH": ("units", 7.35, 7.45, 2, -1),
    "Bicarbonate": ("mEq/L", 22, 29, 0, -1),
    "INR(PT)": ("ratio", 0.9, 1.1, 1, +1),
    "Alanine Aminotransferase (ALT)": ("IU/L", 7, 56, 0, +1),
    "Albumin": ("g/dL", 3.5, 5.2, 1, -1),
    "C-Reactive Protein": ("mg/L", 0, 10, 0, +1),
}
VITALS = {
    "Heart Rate": ("bpm", 60, 100, +1),
    "Respiratory Rate": ("insp/min", 12, 20, +1),
    "O2 Saturation Pulseoxymetry": ("%", 94, 100, -1),
    "Temperature": ("C", 36.1, 37.8, +1),
    "Non Invasive Blood Pressure systolic": ("mmHg", 100, 140, -1),
}
# condition: (diagnoses (code, description, risk weight), labs, drugs, prior weight)
CONDITIONS = {
    "sepsis": (
        [("A41.9", "Sepsis, unspecified organism", 0.5), ("R65.21", "Severe sepsis with septic shock", 0.9)],
        ["Lactate", "White Blood Cells", "C-Reactive Protein", "Platelet Count"],
        ["Piperacillin-Tazobactam 4.5 g IV q6h", "Vancomycin 1 g IV q12h", "Norepinephrine 0.1 mcg/kg/min IV"],
        1.0,
    ),
    "aki": (
        [("N17.9", "Acute kidney failure, unspecified", 0.4)],
        ["Creatinine", "Urea Nitrogen", "Potassium", "Bicarbonate"],
        ["Sodium Bicarbonate 650 mg PO BID", "Calcium Gluconate 1 g IV once"],
        0.8,
    ),
    "chf": (
        [("I50.9", "Heart failure, unspecified", 0.4), ("I50.23", "Acute on chronic systolic heart failure", 0.5)],
        ["NT-proBNP", "Troponin T", "Sodium", "Creatinine"],
        ["Furosemide 40 mg IV BID", "Metoprolol Succinate XL 25 mg PO daily", "Lisinopril 10 mg PO daily"],
        0.9,
    ),
    "pneumonia": (
        [("J18.9", "Pneumonia, unspecified organism", 0.3), ("J96.01", "Acute respiratory failure with hypoxia", 0.7)],
        ["White Blood Cells", "C-Reactive Protein", "pH"],
        ["Ceftriaxone 1 g IV daily", "Azithromycin 500 mg IV daily", "Albuterol 0.083% Neb Soln q4h"],
        0.9,
    ),
    "dka": (
        [("E11.10", "Type 2 diabetes mellitus with ketoacidosis", 0.3)],
        ["Glucose", "Bicarbonate", "Potassium", "pH"],
        ["Insulin Regular 10 units IV q1h", "Potassium Chloride 20 mEq PO once"],
        0.5,
    ),
    "gi_bleed": (
        [("K92.2", "Gastrointestinal hemorrhage, unspecified", 0.4)],
        ["Hemoglobin", "Platelet Count", "INR(PT)"],
        ["Pantoprazole 40 mg IV q12h", "Packed Red Blood Cells 1 unit IV once"],
        0.6,
    ),
    "liver": (
        [("K72.00", "Acute and subacute hepatic failure", 0.8), ("K70.30", "Alcoholic cirrhosis of liver", 0.4)],
        ["Bilirubin, Total", "Alanine Aminotransferase (ALT)", "Albumin", "INR(PT)"],
        ["Lactulose 30 mL PO TID", "Rifaximin 550 mg PO BID"],
        0.4,
    ),
    "copd": (
        [("J44.1", "Chronic obstructive pulmonary disease with acute exacerbation", 0.2)],
        ["pH", "Bicarbonate"],
        ["Prednisone 40 mg PO daily", "Ipratropium Bromide Neb q6h"],
        0.7,
    ),
}
# co-occurrence: conditions that tend to come together (second condition given the first)
COMORBID = {
    "sepsis": ["aki", "pneumonia", "liver"],
    "aki": ["sepsis", "chf", "dka"],
    "chf": ["aki", "copd"],
    "pneumonia": ["sepsis", "copd"],
    "dka": ["aki"],
    "gi_bleed": ["liver"],
    "liver": ["gi_bleed", "aki"],
    "copd": ["pneumonia", "chf"],
}
ROUTINE_LABS = ["Sodium", "Potassium", "Glucose", "Hemoglobin", "White Blood Cells", "Creatinine"]
ROUTINE_DRUGS = ["Heparin 5000 units SC q8h", "Acetaminophen 650 mg PO q6h PRN", "Ondansetron 4 mg IV q6h PRN"]


# ------------------------------------------------------------------------------------------------ corpus
def stdlib_docstrings(max_bytes: int) -> list[str]:
    """Docstrings of the standard library's own .py files (sorted by path, test suites skipped), parsed
    with `ast` and never imported, until ``max_bytes`` of text."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "site-packages", "lib2to3", "turtledemo", "__pycache__"}
    out, size = [], 0
    for f in sorted(root.rglob("*.py")):
        if skip.intersection(f.relative_to(root).parts):
            continue
        try:
            tree = compile(f.read_text(encoding="utf-8", errors="strict"), str(f), "exec", ast.PyCF_ONLY_AST)
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        for nd in ast.walk(tree):
            if isinstance(nd, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(nd, clean=True)
                if doc:
                    out.append(doc)
                    size += len(doc.encode("utf-8"))
                    if size >= max_bytes:
                        return out
    return out


CORPUS_SCHEMA = TableSchema("medtpe.general_corpus", {"text": "str"}, no_missing=("text",))
EHR_SCHEMA = TableSchema(
    "medtpe.ehr",
    {"record_id": "int", "split": "str", "text": "str", "mortality": "int", "long_stay": "int"},
    min_rows=4,
    covers={"split": ("train", "test")},
)


def general_corpus(p: Params) -> pd.DataFrame:
    if p.data.corpus_path:
        df = read_user_file(p.data.corpus_path, key="medtpe.data.corpus_path", schema=CORPUS_SCHEMA, kind="parquet")
        return df[["text"]].reset_index(drop=True)
    return pd.DataFrame({"text": stdlib_docstrings(p.data.corpus_bytes)})


# ------------------------------------------------------------------------------------------------ EHR
def _stamp(t0: float, hours: float) -> str:
    return str(np.datetime64(int(t0 + hours * 60), "m")).replace("T", " ")


def _value(rng, lab: str, abnormal: bool, severity: float) -> tuple[str, str]:
    unit, lo, hi, dec, direction = LABS[lab]
    span = hi - lo
    if abnormal:
        mag = span * (0.2 + 0.6 * abs(rng.normal()) + 0.3 * max(severity, 0))
        v = hi + mag if direction > 0 else max(lo - mag * 0.5, lo * 0.2)
        flag = "high" if direction > 0 else "low"
    else:
        v, flag = rng.uniform(lo, hi), None
    txt = f"{v:.{dec}f}" if dec else f"{round(v)}"
    return txt, flag


def _stay(rng, p: Params, labs: list[str]) -> dict:
    d = p.data
    names = list(CONDITIONS)
    prior = np.array([CONDITIONS[c][3] for c in names])
    first = names[rng.choice(len(names), p=prior / prior.sum())]
    conds = [first]
    for _ in range(2):
        if rng.random() < 0.45:
            nxt = COMORBID[conds[-1]][rng.integers(len(COMORBID[conds[-1]]))]
            if nxt not in conds:
                conds.append(nxt)
    severity = rng.normal()
    age = int(np.clip(rng.normal(66, 14), 18, 99))
    sex = "male" if rng.random() < 0.5 else "female"
    diags = [CONDITIONS[c][0][rng.integers(len(CONDITIONS[c][0]))] for c in conds]
    p_abn = 1 / (1 + math.exp(-(0.3 + 1.2 * severity)))
    cond_labs = [lab for c in conds for lab in CONDITIONS[c][1] if lab in labs] or labs[:1]
    cond_drugs = [x for c in conds for x in CONDITIONS[c][2]]
    n_events = int(rng.integers(d.n_events[0], d.n_events[1] + 1))
    t0 = float(rng.integers(0, 3 * 365 * 24 * 60)) + np.datetime64("2020-01-01T00:00", "m").astype(np.int64)
    hours, events, n_abn, n_checked = 0.0, [], 0, 0
    for _ in range(n_events):
        hours += float(rng.choice([1, 2, 3, 4, 6, 8]))
        kind = rng.choice(["lab", "vital", "med"], p=[0.5, 0.25, 0.25])
        when = _stamp(t0, hours)
        if kind == "lab":
            related = rng.random() < 0.75
            lab = cond_labs[rng.integers(len(cond_labs))] if related else labs[rng.integers(len(labs))]
            abn = rng.random() < (p_abn if related else 0.12)
            val, flag = _value(rng, lab, abn, severity)
            n_abn += abn
            n_checked += 1
            events.append(f"{when} Lab {lab} {val} {LABS[lab][0]}" + (f" ({flag})" if flag else ""))
        elif kind == "vital":
            name = list(VITALS)[rng.integers(len(VITALS))]
            unit, lo, hi, direction = VITALS[name]
            abn = rng.random() < 0.7 * p_abn
            if abn:
                v = hi * (1.1 + 0.2 * abs(rng.normal())) if direction > 0 else lo * (0.85 - 0.1 * abs(rng.normal()))
            else:
                v = rng.uniform(lo, hi)
            n_abn += abn
            n_checked += 1
            txt = f"{v:.1f}" if name == "Temperature" else f"{round(v)}"
            events.append(f"{when} Vital {name} {txt} {unit}" + (" (abnormal)" if abn else ""))
        else:
            drug = (
                cond_drugs[rng.integers(len(cond_drugs))]
                if rng.random() < 0.7
                else ROUTINE_DRUGS[rng.integers(len(ROUTINE_DRUGS))]
            )
            events.append(f"{when} Med {drug}")
    adm = rng.choice(["EMERGENCY", "URGENT", "ELECTIVE"], p=[0.7, 0.2, 0.1])
    where = {"EMERGENCY": "EMERGENCY ROOM", "URGENT": "PHYSICIAN REFERRAL", "ELECTIVE": "CLINIC REFERRAL"}[adm]
    frac_abn = n_abn / max(n_checked, 1)
    diag_w = sum(w for _, _, w in diags)
    mort = (
        1.6 * (frac_abn - 0.4)
        + 0.35 * (age - 66) / 14
        + 0.8 * (diag_w - 0.8)
        + 0.3 * severity
        + 0.3 * (adm == "EMERGENCY")
    )
    stay = 0.8 * len(conds) - 1.2 + 0.9 * (frac_abn - 0.4) + 0.5 * ("sepsis" in conds) + 0.25 * (age - 66) / 14
    return {
        "sex": sex,
        "age": age,
        "adm": adm,
        "where": where,
        "t0": t0,
        "diags": diags,
        "events": events,
        "mort_score": mort,
        "stay_score": stay,
        "n_events": n_events,
    }


def render(s: dict, fmt: str) -> str:
    if fmt == "json":
        return (
            json.dumps(
                {
                    "patient": {"age": s["age"], "sex": s["sex"]},
                    "admission": {"type": s["adm"], "location": s["where"], "time": _stamp(s["t0"], 0)},
                    "diagnoses": [f"{c} {t}" for c, t, _ in s["diags"]],
                    "events": s["events"],
                },
                indent=1,
            )
            + "\n"
        )
    diag = "; ".join(f"{c} {t}" for c, t, _ in s["diags"])
    return (
        f"Patient: {s['age']}-year-old {s['sex']}. Admission: {s['adm']} from {s['where']} on "
        f"{_stamp(s['t0'], 0)}.\nDiagnoses: {diag}.\nEvents:\n" + "\n".join(s["events"]) + "\n"
    )


def _intercept(score: np.ndarray, prevalence: float, noise: np.ndarray) -> float:
    lo, hi = -30.0, 30.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if (1 / (1 + np.exp(-(score + noise + mid)))).mean() < prevalence:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def make_ehr(p: Params) -> pd.DataFrame:
    """One table of stays (train then test rows): text, both labels, split."""
    d = p.data
    if d.ehr_path:
        df = read_user_file(d.ehr_path, key="medtpe.data.ehr_path", schema=EHR_SCHEMA, kind="parquet")
        return df.reset_index(drop=True)
    rng = np.random.default_rng(d.seed)
    labs = list(LABS)[: d.n_labs]
    n = d.n_train + d.n_test
    stays = [_stay(rng, p, labs) for _ in range(n)]
    out = {
        "record_id": np.arange(n),
        "split": ["train"] * d.n_train + ["test"] * d.n_test,
        "text": [render(s, d.format) for s in stays],
        "n_events": [s["n_events"] for s in stays],
    }
    for task, key, prev in (
        ("mortality", "mort_score", d.prevalence_mortality),
        ("long_stay", "stay_score", d.prevalence_long_stay),
    ):
        score = d.signal_scale * np.array([s[key] for s in stays])
        noise = rng.normal(0, 0.3, n)
        b = _intercept(score, prev, noise)
        out[task] = (rng.random(n) < 1 / (1 + np.exp(-(score + noise + b)))).astype(np.int64)
    return pd.DataFrame(out)
