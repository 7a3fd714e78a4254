"""Train and score every variant: the base model on the original tokeniser (trained once per run; its
answer distribution is the self-supervised target), MedTPE init-only, MedTPE + SSFT (soft or hard
targets, embedding rows only), extend mode, full fine-tuning, and the compression baselines at MedTPE's
per-record length (token dropping by self-information, truncation keeping the most recent events)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from pipelines.core.api import fit, node_setup
from pipelines.medtpe.data import ANSWERS, QUESTIONS
from pipelines.medtpe.model import adapt_model, make_model, only_rows_train
from pipelines.medtpe.params import Params
from pipelines.medtpe.tpe import BPE, SPECIALS, TPE, build_tpe

EVAL_BATCH = 64


# ------------------------------------------------------------------------------------------------ tokens
def answer_ids(bpe: BPE) -> tuple[int, int]:
    """IDs of the first token of " yes" and " no" (the scored answer position)."""
    yes, no = answer_tokens(bpe)
    return bpe.stoi[yes], bpe.stoi[no]


def answer_tokens(bpe: BPE) -> list[str]:
    return [bpe.strings(ANSWERS[1])[0], bpe.strings(ANSWERS[0])[0]]


def prompts(df: pd.DataFrame, tasks: list[str]) -> pd.DataFrame:
    """One row per (stay, task): the prompt text and its binary label."""
    return pd.concat(
        [
            pd.DataFrame(
                {
                    "record_id": df["record_id"].to_numpy(),
                    "task": t,
                    "text": df["text"].to_numpy() + QUESTIONS[t],
                    "record": df["text"].to_numpy(),
                    "label": df[t].to_numpy(),
                }
            )
            for t in tasks
        ],
        ignore_index=True,
    )


def test_stays(ehr: pd.DataFrame, p: Params, seed: int) -> pd.DataFrame:
    """The test stays seed ``seed`` is scored on: with ``data.test_split: per_seed`` each seed gets its own
    disjoint, contiguous shard of the test stays (so the seed interval of a paired delta includes the
    test-sampling noise and the run covers every test stay once); with ``shared`` every seed scores all."""
    te = ehr[ehr.split == "test"]
    if p.data.test_split == "shared" or len(p.seeds) == 1:
        return te
    shards = np.array_split(np.arange(len(te)), len(p.seeds))
    return te.iloc[shards[list(p.seeds).index(seed)]]


def pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(s) for s in seqs])
    ids = torch.full((len(seqs), int(lengths.max())), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
    return ids, lengths


def train_bpe_node(corpus: pd.DataFrame, p: Params) -> dict:
    """data.bpe: the base byte-level BPE on the general-domain corpus only (clinical terms split)."""
    from pipelines.medtpe.tpe import train_bpe

    bpe = BPE(train_bpe(corpus["text"].tolist(), p.bpe.vocab_size, p.bpe.min_pair_freq))
    if len(set(answer_tokens(bpe))) != 2:
        raise ValueError("data.bpe: ' yes' and ' no' start with the same token; the answer cannot be scored")
    return bpe.to_dict()


def build_tpes(ehr: pd.DataFrame, bpe_base: dict, p: Params) -> dict:
    """data.tpe: the layered tokenisers of each seed (replace and extend mode), mined on a seeded subset
    of the training stays' prompts."""
    bpe = BPE.from_dict(bpe_base)
    train = prompts(ehr[ehr.split == "train"], p.tasks)
    out = {}
    for seed in p.seeds:
        rng = np.random.default_rng(seed)
        stays = ehr[ehr.split == "train"]["record_id"].to_numpy()
        pick = set(rng.choice(stays, min(p.tpe.mine_records, len(stays)), replace=False).tolist())
        texts = train[train.record_id.isin(pick)]["text"].tolist()
        kw = dict(
            max_n=p.tpe.max_n,
            max_m=p.tpe.max_m,
            min_freq=p.tpe.min_freq,
            number_filter=p.tpe.number_filter,
            protect=answer_tokens(bpe),
        )
        out[str(seed)] = {
            "replace": build_tpe(bpe, texts, mode="replace", **kw).to_dict(),
            "extend": build_tpe(bpe, texts, mode="extend", **kw).to_dict(),
        }
    return out


# ------------------------------------------------------------------------------------------------ scoring
@torch.no_grad()
def score(model, seqs: list[list[int]], pad_id: int, batch: int = EVAL_BATCH) -> torch.Tensor:
    """Softmax over the vocabulary at each prompt's last token → [N, V]."""
    model.eval()
    order = np.argsort([len(s) for s in seqs])  # length-sorted batches waste no padding
    out = torch.empty(len(seqs), model.head.weight.shape[0])
    for s in range(0, len(seqs), batch):
        idx = order[s : s + batch]
        ids, lengths = pad([seqs[i] for i in idx], pad_id)
        out[torch.as_tensor(idx)] = model.last_logits(ids, lengths).softmax(-1)
    return out


def self_information(bpe: BPE, texts: list[str]) -> dict[int, float]:
    """−log p(token) under the add-one unigram distribution of the training prompts."""
    counts = np.ones(len(bpe.vocab))
    for t in texts:
        np.add.at(counts, bpe.encode(t), 1)
    return dict(enumerate(-np.log(counts / counts.sum())))


def drop_tokens(ids: list[int], keep_tail: int, target: int, info: dict[int, float]) -> list[int]:
    """LLMLingua-2-like: drop the lowest self-information tokens of the record part (the question tail is
    kept) until ``target`` tokens are left, keeping order."""
    head = ids[: len(ids) - keep_tail]
    n_drop = max(0, len(ids) - target)
    drop = set(sorted(range(len(head)), key=lambda i: (info[head[i]], i))[:n_drop])
    return [t for i, t in enumerate(head) if i not in drop] + ids[len(ids) - keep_tail :]


def truncate(ids: list[int], keep_tail: int, target: int) -> list[int]:
    """Keep the question tail and the most recent record tokens, ``target`` tokens in all."""
    head = ids[: len(ids) - keep_tail]
    keep = max(target - keep_tail, 0)
    return (head[len(head) - keep :] if keep else []) + ids[len(ids) - keep_tail :]


# ------------------------------------------------------------------------------------------------ training
def _base_model(state: dict, n_vocab: int, p: Params):
    m = make_model(n_vocab, p.model)
    m.load_state_dict(state)
    return m


def _answer_loss(yes: int, no: int):
    def loss(model, ids, lengths, y):
        logits = model.last_logits(ids, lengths)
        target = torch.where(y.bool(), torch.tensor(yes), torch.tensor(no))
        return F.cross_entropy(logits, target)

    return loss


def _sampler(seqs: list[list[int]], pad_id: int, batch: int, *extra: torch.Tensor):
    def sample(step: int, gen: torch.Generator):
        idx = torch.randint(len(seqs), (batch,), generator=gen)
        ids, lengths = pad([seqs[i] for i in idx.tolist()], pad_id)
        return (ids, lengths, *(e[idx] for e in extra))

    return sample


def train_original(ehr: pd.DataFrame, bpe_base: dict, p: Params) -> tuple[pd.DataFrame, pd.DataFrame, dict, dict]:
    """train.original: the small LM on the original tokeniser, trained once per run (seed = seeds[0]) with
    cross-entropy on the first answer token at the last prompt position."""
    node_setup(p, p.seeds[0])
    bpe = BPE.from_dict(bpe_base)
    yes, no = answer_ids(bpe)
    tr = prompts(ehr[ehr.split == "train"], p.tasks)
    seqs = [bpe.encode(t) for t in tr["text"]]
    model = make_model(len(bpe.vocab), p.model)
    losses: list[float] = []
    fit(
        model,
        None,
        _answer_loss(yes, no),
        steps=p.base.steps,
        lr=p.base.lr,
        weight_decay=0.01,
        sample_batch=_sampler(seqs, bpe.pad_id, p.base.batch_size, torch.tensor(tr["label"].to_numpy())),
        seed=p.seeds[0],
        desc="medtpe.original",
        callback=lambda s: losses.append(s.loss),
        grad_clip=1.0,
    )
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    te_all = prompts(ehr[ehr.split == "test"], p.tasks)
    test_ids = [bpe.encode(t) for t in te_all["text"]]
    probs_all = score(model, test_ids, bpe.pad_id)
    n_params = sum(q.numel() for q in model.parameters())
    frames = []
    for seed in p.seeds:  # the base model is scored once; each seed reads its own shard of the scores
        keep = te_all["record_id"].isin(test_stays(ehr, p, seed)["record_id"]).to_numpy()
        idx = np.flatnonzero(keep)
        te, ids = te_all.iloc[idx], [test_ids[i] for i in idx]
        frames.append(
            _frame(
                te,
                probs_all[torch.as_tensor(idx)],
                yes,
                no,
                ids,
                ids,
                [bpe.decode(s) == t for s, t in zip(ids, te["text"])],
                seed,
                "original",
                len(bpe.vocab),
                n_params,
                n_params,
                0,
            )
        )
    preds = pd.concat(frames, ignore_index=True)
    from pipelines.medtpe.evaluate import results_table

    res = results_table("original", preds)
    for seed in p.seeds[:1]:
        res.history(seed, "loss", losses)
    return res.table(), preds, state, {"loss": losses}


def _frame(te, probs, yes, no, ids, ids_orig, roundtrip, seed, variant, vocab, trainable, total, n_new):
    return pd.DataFrame(
        {
            "seed": seed,
            "variant": variant,
            "task": te["task"].to_numpy(),
            "record_id": te["record_id"].to_numpy(),
            "label": te["label"].to_numpy(),
            "p_yes": probs[:, yes].numpy(),
            "p_no": probs[:, no].numpy(),
            "compliant": np.isin(probs.argmax(-1).numpy(), [yes, no]),
            "n_tokens": [len(s) for s in ids],
            "n_tokens_orig": [len(s) for s in ids_orig],
            "roundtrip_ok": np.asarray(roundtrip, bool),
            "vocab_size": vocab,
            "trainable_params": trainable,
            "total_params": total,
            "n_new_tokens": n_new,
        }
    )


def train_variant(
    ehr: pd.DataFrame, bpe_base: dict, tpes: dict, base_state: dict, p: Params, variant: str
) -> tuple[pd.DataFrame, dict]:
    """train.<variant> for every variant but `original`, on every seed: the long table and the raw
    predictions (artifacts, for the plots)."""
    bpe = BPE.from_dict(bpe_base)
    yes0, no0 = answer_ids(bpe)
    tr = prompts(ehr[ehr.split == "train"], p.tasks)
    frames, fitlog = [], {}
    for seed in p.seeds:
        node_setup(p, seed)
        te = prompts(test_stays(ehr, p, seed), p.tasks)
        orig_test = [bpe.encode(t) for t in te["text"]]
        base = _base_model(base_state, len(bpe.vocab), p)
        n_total = sum(q.numel() for q in base.parameters())
        spec = tpes[str(seed)]
        tok = TPE.from_dict(bpe, spec["extend" if variant == "extend" else "replace"])
        tpe_test = [tok.encode(t) for t in te["text"]]
        if variant in ("token_drop", "truncation"):
            q_len = [len(bpe.encode(QUESTIONS[t])) for t in te["task"]]
            target = [len(s) for s in tpe_test]
            if variant == "token_drop":
                rng = np.random.default_rng(seed)
                pick = rng.choice(len(tr), min(len(tr), 2 * p.tpe.mine_records), replace=False)
                info = self_information(bpe, tr["text"].iloc[pick].tolist())
                ids = [drop_tokens(s, q, n, info) for s, q, n in zip(orig_test, q_len, target)]
            else:
                ids = [truncate(s, q, n) for s, q, n in zip(orig_test, q_len, target)]
            probs = score(base, ids, bpe.pad_id)
            rt = [bpe.decode(s) == t for s, t in zip(ids, te["text"])]
            frames.append(
                _frame(te, probs, yes0, no0, ids, orig_test, rt, seed, variant, len(bpe.vocab), 0, n_total, 0)
            )
            continue
        model = adapt_model(base, bpe.vocab, tok, set(SPECIALS))
        yes, no = tok.stoi[bpe.vocab[yes0]], tok.stoi[bpe.vocab[no0]]
        new_rows = tok.new_ids()
        trainable = 0
        if variant != "medtpe_init":
            trainable, losses = _ssft(model, base, bpe, tok, tr, new_rows, p, seed, variant)
            fitlog[str(seed)] = losses
        probs = score(model, tpe_test, bpe.pad_id)
        rt = [tok.decode(s) == t for s, t in zip(tpe_test, te["text"])]
        frames.append(
            _frame(
                te,
                probs,
                yes,
                no,
                tpe_test,
                orig_test,
                rt,
                seed,
                variant,
                len(tok.vocab),
                trainable,
                sum(q.numel() for q in model.parameters()),
                len(new_rows),
            )
        )
    preds = pd.concat(frames, ignore_index=True)
    from pipelines.medtpe.evaluate import results_table

    res = results_table(variant, preds)
    for seed, losses in fitlog.items():
        res.history(int(seed), f"ssft_loss_seed{seed}", losses)
    return res.table(), {"predictions": {k: v.tolist() for k, v in preds.items()}}


def _ssft(
    model, base, bpe: BPE, tok: TPE, tr: pd.DataFrame, new_rows: list[int], p: Params, seed: int, variant: str
) -> tuple[int, list[float]]:
    """Self-supervised fine-tuning: the original model's answer distribution on the original tokenisation
    is the target for the MedTPE model on the MedTPE tokenisation (soft: KL; hard: its greedy answer)."""
    rng = np.random.default_rng(seed)
    pool = rng.choice(len(tr), min(p.ssft.pool, len(tr)), replace=False)
    texts = tr["text"].iloc[pool].tolist()
    teacher = score(base, [bpe.encode(t) for t in texts], bpe.pad_id)  # [N, V_old]
    V = model.head.weight.shape[0]
    if V > teacher.shape[1]:
        teacher = F.pad(teacher, (0, V - teacher.shape[1]))
    seqs = [tok.encode(t) for t in texts]
    if variant == "full_ft":
        for q in model.parameters():
            q.requires_grad_(True)
        params, lr = list(model.parameters()), p.ssft.full_ft_lr
        trainable = sum(q.numel() for q in params)
    else:
        params, lr = only_rows_train(model, new_rows), p.ssft.lr
        trainable = 2 * len(new_rows) * model.embed.weight.shape[1]
    frozen = [r for r in range(model.embed.weight.shape[0]) if r not in set(new_rows)]
    before = (model.embed.weight[frozen].clone(), model.head.weight[frozen].clone())

    if variant == "medtpe_hard":

        def loss_fn(m, ids, lengths, t):
            return F.cross_entropy(m.last_logits(ids, lengths), t.argmax(-1))
    else:

        def loss_fn(m, ids, lengths, t):
            return F.kl_div(m.last_logits(ids, lengths).log_softmax(-1), t, reduction="batchmean")

    losses: list[float] = []
    fit(
        model,
        None,
        loss_fn,
        steps=p.ssft.steps,
        lr=lr,
        weight_decay=0.0,
        params=params,
        sample_batch=_sampler(seqs, bpe.pad_id, p.ssft.batch_size, teacher),
        seed=seed,
        desc=f"medtpe.{variant}",
        callback=lambda s: losses.append(s.loss),
        grad_clip=1.0,
    )
    if variant != "full_ft":
        moved = max(
            float((model.embed.weight[frozen] - before[0]).abs().max()),
            float((model.head.weight[frozen] - before[1]).abs().max()),
        )
        if not math.isclose(moved, 0.0, abs_tol=0.0):
            raise RuntimeError(f"node 'medtpe.train.{variant}': frozen embedding rows changed by {moved:g}")
    model.eval()
    return trainable, losses
