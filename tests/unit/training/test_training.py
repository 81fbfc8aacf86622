"""The fine-tuning engine and ``python -m analysis finetune`` on tiny models."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModelForMaskedLM

from analysis.core.activations import encode_truncated, truncate_indices
from analysis.core.inputs import InputError, TextInputs
from analysis.training.finetune import Splits, further_pretrain, load_checkpoint, majority_vote, run_finetune, split_off
from analysis.training.heads import head_names
from analysis.training.taskdata import label_ids, prepare
from analysis.training.train import Classifier, FinetuneConfig, evaluate, layer_of, parameter_groups, train
from cli.main import main
from models.loading import ModelSpec, load_encoder
from tests.support.data import synthetic
from tests.support.models import tiny_tokenizer

# --- truncation ---------------------------------------------------------------------------------------------

def test_head_plus_tail_is_128_and_382_at_512():
    keep = truncate_indices(1000, 510, "head+tail")
    assert keep == list(range(128)) + list(range(1000 - 382, 1000))


@pytest.mark.parametrize("strategy, expected", [("head", [0, 1, 2, 3]), ("tail", [6, 7, 8, 9]),
                                                ("head+tail", [0, 7, 8, 9])])
def test_truncation_strategies(strategy, expected):
    assert truncate_indices(10, 4, strategy) == expected
    assert truncate_indices(3, 4, strategy) == [0, 1, 2]  # short texts are untouched


def test_head_plus_tail_scales_with_the_budget():
    keep = truncate_indices(300, 126, "head+tail")  # max length 128
    assert len(keep) == 126 and keep[:32] == list(range(32)) and keep[-1] == 299 and 32 not in keep


def test_encoded_truncation_keeps_the_chosen_tokens_with_specials():
    tok = tiny_tokenizer()
    words = "the film is good and it was very bad ! fun".split()
    ids, types, cut = encode_truncated(tok, [" ".join(words)], None, 7, "head+tail")
    full = tok(" ".join(words), add_special_tokens=False)["input_ids"]
    keep = truncate_indices(len(full), 5, "head+tail")
    assert ids[0] == [tok.cls_token_id, *[full[i] for i in keep], tok.sep_token_id] and cut == 1
    pair_ids, pair_types, _ = encode_truncated(tok, ["the film is good"], ["fun"], 32, "head")
    assert pair_ids[0] == tok("the film is good", "fun")["input_ids"]
    assert pair_types[0] == tok("the film is good", "fun")["token_type_ids"]


# --- learning rates ---------------------------------------------------------------------------------------

def test_layer_wise_learning_rates(bert4):
    encoder, _ = load_encoder(ModelSpec(str(bert4), device="cpu"))
    model = Classifier(encoder, "cls", 2)
    config = FinetuneConfig(lr=1.0, layer_decay=0.5, weight_decay=0.01)
    lr_of, wd_of = {}, {}
    for group in parameter_groups(model, config):
        for p in group["params"]:
            lr_of[id(p)], wd_of[id(p)] = group["lr"], group["weight_decay"]
    named = dict(model.named_parameters())
    assert set(lr_of) == {id(p) for p in named.values()}  # every parameter is optimised, once
    assert lr_of[id(named["encoder.embeddings.word_embeddings.weight"])] == 0.5 ** 4
    for k in range(4):  # encoder.layer.k is layer k + 1: lr * xi^(L - (k + 1))
        assert lr_of[id(named[f"encoder.encoder.layer.{k}.attention.self.query.weight"])] == 0.5 ** (3 - k)
    assert lr_of[id(named["head.classifier.out.weight"])] == 1.0
    assert wd_of[id(named["encoder.encoder.layer.0.attention.output.LayerNorm.weight"])] == 0.0
    assert wd_of[id(named["encoder.encoder.layer.0.attention.self.query.bias"])] == 0.0
    assert wd_of[id(named["encoder.encoder.layer.0.attention.self.query.weight"])] == 0.01


def test_layer_of_other_families():
    assert layer_of("embeddings.word_embeddings.weight", 12) == 0
    assert layer_of("encoder.embedding_hidden_mapping_in.weight", 12) == 0  # ALBERT
    assert layer_of("transformer.layer.3.ffn.lin1.weight", 6) == 4  # DistilBERT
    assert layer_of("encoder.albert_layer_groups.0.albert_layers.0.ffn.weight", 12) == 12  # shared: top


# --- training -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", head_names(4))
def test_two_steps_of_fine_tuning_move_every_head(bert4, name):
    encoder, tok = load_encoder(ModelSpec(str(bert4), device="cpu"))
    data = synthetic(8)
    labels = label_ids(data.labels)
    task = prepare(tok, data, labels, 32, "head")
    model = Classifier(encoder, name, len(labels), dropout=0.0)
    before = {k: v.clone() for k, v in model.head.state_dict().items()}
    model, state = train(model, task, task, FinetuneConfig(head=name, max_steps=2, batch_size=4, lr=1e-3, warmup=0),
                         tok.pad_token_id)
    assert state.step == 2
    changed = [k for k, v in model.head.state_dict().items() if not torch.equal(v, before[k])]
    assert changed == list(before)  # every head tensor was updated


@pytest.mark.slow
def test_an_easy_task_is_learned(bert4, tmp_path):
    splits = Splits(synthetic(160), synthetic(40, seed=1), synthetic(40, seed=2))
    config = FinetuneConfig(head="attention", epochs=8, batch_size=16, lr=3e-3, seed=0)
    metrics = run_finetune(ModelSpec(str(bert4), device="cpu"), splits, config, tmp_path)
    assert metrics["evaluated_on"] == "test" and metrics["accuracy"] > 0.9  # chance is 0.5
    assert len(metrics["history"]) == 8 and metrics["confusion_matrix"] and metrics["labels"] == ["neg", "pos"]
    # what was written is what a reloaded checkpoint predicts
    model, tok, meta = load_checkpoint(tmp_path / "checkpoint")
    test = prepare(tok, splits.test, {n: i for i, n in enumerate(meta["labels"])}, 128, "head")
    again = evaluate(model, test, 8, tok.pad_token_id, "cpu")
    written = pd.read_csv(tmp_path / "predictions.csv")
    names = list(meta["labels"])  # label name -> id, in id order
    assert written.prediction.tolist() == [names[p] for p in again.predictions]
    weights = pd.read_csv(tmp_path / "layer_weights.csv")
    assert list(weights.columns) == ["example_id", "layer_1", "layer_2", "layer_3", "layer_4"]
    np.testing.assert_allclose(weights.iloc[:, 1:].sum(1), 1, rtol=1e-5)
    vectors = np.load(tmp_path / "epochs" / "1" / "val_cls.npy")
    assert vectors.shape == (5, 40, 16) and vectors.dtype == np.float16
    # each epoch's vectors are a layered vector set of the one store (issue 35), its shard the file above
    from analysis.training.runs import epoch_vectors

    found = epoch_vectors(tmp_path, 1)
    assert found.manifest["shards"][0]["file"] == "val_cls.npy" and found.layers == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(found.array(), vectors)
    (tmp_path / "epochs" / "2" / "manifest.json").unlink()  # a job written before the sets: read the same
    np.testing.assert_array_equal(epoch_vectors(tmp_path, 2).array(),
                                  np.load(tmp_path / "epochs" / "2" / "val_cls.npy"))
    assert (tmp_path / "epochs" / "2" / "manifest.json").is_file()
    assert epoch_vectors(tmp_path, 99) is None
    # Kao et al. Fig. 2: the fine-tuned encoder read by the pre-trained MLM head (a borrowed head, --head-from)
    from models.loading import load_model

    assert metrics["mlm_head_from"] == str(bert4)
    view = load_model(ModelSpec(str(tmp_path / "checkpoint" / "encoder"), device="cpu", head_from=str(bert4)))
    original = load_model(ModelSpec(str(bert4), device="cpu"))
    tuned = dict(model.encoder.named_parameters())
    for name, p in view.model.base_model.named_parameters():
        assert torch.equal(p, tuned[name]), name
    head, before = dict(view.model.cls.named_parameters()), dict(original.model.cls.named_parameters())
    assert set(head) >= set(before)
    for name, p in before.items():  # the pre-trained head, untied from the fine-tuned embeddings
        assert torch.equal(head[name], p), name
    assert torch.equal(view.model.cls.predictions.decoder.bias, original.model.cls.predictions.bias)
    assert view.mlm_head == f"from {bert4}"


def test_early_stopping_keeps_the_best_epoch(bert4, tmp_path):
    splits = Splits(synthetic(40), synthetic(20, seed=1))
    config = FinetuneConfig(epochs=12, lr=0.05, early_stopping=True, patience=1, batch_size=8)  # lr too high
    metrics = run_finetune(ModelSpec(str(bert4), device="cpu"), splits, config, tmp_path)
    history = metrics["history"]
    best = min(h["val_loss"] for h in history)
    assert len(history) < 12 and history[-1]["val_loss"] > best
    assert metrics["loss"] == pytest.approx(best, rel=1e-5)  # the restored weights are the best epoch's
    # no test set: the validation rows both chose the epoch and were scored, and metrics.json and the page say so
    assert metrics["evaluated_on"] == "validation" and metrics["scored_on_selection_rows"] is True
    assert metrics["epoch_chosen_on"] == "validation loss on the 20 validation rows"
    from ui.jobs import score_line

    assert "also chose the epoch" in score_line(metrics)
    plain = run_finetune(ModelSpec(str(bert4), device="cpu"), splits, FinetuneConfig(epochs=1, batch_size=8),
                         tmp_path / "plain")
    assert plain["scored_on_selection_rows"] is False and plain["epoch_chosen_on"].startswith("none")
    assert "chose the epoch" not in score_line(plain)


def test_cross_validation_and_ensemble(bert4, tmp_path):
    splits = Splits(synthetic(30), test=synthetic(10, seed=3))
    metrics = run_finetune(ModelSpec(str(bert4), device="cpu"), splits,
                           FinetuneConfig(folds=3, epochs=1, batch_size=8), tmp_path)
    assert len(metrics["folds"]) == 3 and "accuracy_std" in metrics and "ensemble_test" in metrics
    assert metrics["accuracy"] == pytest.approx(np.mean([f["accuracy"] for f in metrics["folds"]]))
    assert len(pd.read_csv(tmp_path / "predictions.csv")) == 10


@pytest.mark.slow
def test_further_pretraining_lowers_the_task_mlm_loss(bert4, tmp_path):
    from transformers import AutoModelForMaskedLM, DataCollatorForLanguageModeling

    texts = synthetic(32).texts

    def mlm_loss(path):
        model, tok = AutoModelForMaskedLM.from_pretrained(path).eval(), tiny_tokenizer()
        batch = DataCollatorForLanguageModeling(tok, seed=7)([{"input_ids": tok(t)["input_ids"]} for t in texts])
        with torch.no_grad():
            return model(**batch).loss.item()

    further = further_pretrain(ModelSpec(str(bert4), device="cpu"), texts, 30, tmp_path / "fp", batch_size=8, lr=3e-3)
    assert mlm_loss(further) < mlm_loss(bert4) - 0.5
    metrics = run_finetune(ModelSpec(str(bert4), device="cpu"), Splits(synthetic(16), synthetic(8, seed=1)),
                           FinetuneConfig(epochs=1, further_pretrain_steps=3, batch_size=8), tmp_path / "run")
    assert (tmp_path / "run" / "further_pretrained" / "config.json").is_file() and "accuracy" in metrics


def test_majority_vote():
    votes = [np.array([0, 1, 2, 1]), np.array([0, 2, 2, 0]), np.array([1, 2, 0, 2])]
    assert majority_vote(votes).tolist() == [0, 2, 2, 0]  # last column: a three-way tie goes to the smallest id


def test_bad_labels():
    with pytest.raises(InputError, match="single class"):
        label_ids(["a", "a"])
    with pytest.raises(InputError, match="not in the training data"):
        label_ids(["a", "b"], ["c"])
    with pytest.raises(InputError, match="learning rate"):
        FinetuneConfig(lr=-1)


def test_split_off_is_stratified():
    train_part, val = split_off(synthetic(40), 0.25)
    assert len(val) == 10 and sorted(val.labels).count("pos") == 5 and not set(val.ids) & set(train_part.ids)


# --- CLI -----------------------------------------------------------------------------------------------------

def write_tsv(path, inputs: TextInputs):
    rows = ["text\tlabel"] + [f"{t}\t{lab}" for t, lab in zip(inputs.texts, inputs.labels, strict=True)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_cli_writes_the_contract_files_and_reads_a_config_file(bert4, tmp_path, capsys):
    train_file = write_tsv(tmp_path / "train.tsv", synthetic(24))
    val_file = write_tsv(tmp_path / "val.tsv", synthetic(12, seed=1))
    config = tmp_path / "run.yaml"
    config.write_text(f"model: {bert4}\ntrain: {train_file}\nval: {val_file}\nhead: scalar-mix\nepochs: 5\n"
                      "batch_size: 8\nlr: 0.001\n")
    out = tmp_path / "out"
    assert main(["finetune", "--config", str(config), "--epochs", "1", "--out", str(out)]) == 0  # flag wins
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"accuracy", "macro_f1", "head_trainable_parameters", "history"} <= set(metrics)
    assert len(metrics["history"]) == 1 and metrics["head"] == "scalar-mix"
    assert list(pd.read_csv(out / "predictions.csv").columns) == ["example_id", "label", "prediction"]
    assert list(pd.read_csv(out / "layer_weights.csv").columns)[:2] == ["example_id", "layer_0"]
    assert (out / "checkpoint" / "encoder" / "config.json").is_file() and (out / "checkpoint" / "head.json").is_file()
    assert json.loads((out / "run.json").read_text())["config"]["batch_size"] == 8
    said = capsys.readouterr().err.split("wrote ", 1)[1].splitlines()[0]  # every file and folder it wrote
    assert said == f"{out}/: " + ", ".join(sorted(p.name + "/" * p.is_dir() for p in out.iterdir()))
    assert "layer_weights.csv" in said and "epochs/" in said


@pytest.mark.parametrize("extra, message", [
    (["--head", "gru-share-5"], "must be one of"),
    (["--lr", "0"], "learning rate"),
    (["--train", "missing.tsv"], "no such file"),
    (["--epochs", "0"], "must be at least 1"),
])
def test_cli_bad_input_is_one_line(bert4, tmp_path, capsys, extra, message):
    train_file = write_tsv(tmp_path / "train.tsv", synthetic(20))
    try:
        code = main(["finetune", "--model", str(bert4), "--train", str(train_file), "--out", str(tmp_path / "o"),
                     *extra])
    except SystemExit as exc:  # argparse's own checks
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error:") and message in err[-1]


def test_preset_sets_defaults_and_flags_win(bert4, tmp_path):
    train_file = write_tsv(tmp_path / "train.tsv", synthetic(20))
    out = tmp_path / "out"
    argv = ["finetune", "--model", str(bert4), "--train", str(train_file), "--out", str(out), "--preset", "grubert",
            "--epochs", "1", "--head", "gru-share-2", "--max-steps", "2"]
    assert main(argv) == 0
    config = json.loads((out / "run.json").read_text())["config"]
    assert config["schedule"] == "epoch-decay" and config["batch_size"] == 64 and config["early_stopping"]
    assert config["epochs"] == 1 and config["head"] == "gru-share-2"  # given explicitly


def test_epoch_decay_schedule(bert4):
    encoder, tok = load_encoder(ModelSpec(str(bert4), device="cpu"))
    data = synthetic(8)
    task = prepare(tok, data, label_ids(data.labels), 32, "head")
    seen = []
    model = Classifier(encoder, "cls", 2)
    config = FinetuneConfig(epochs=3, batch_size=4, lr=1.0, schedule="epoch-decay", warmup=0.0)
    train(model, task, task, config, tok.pad_token_id,
          callbacks=[lambda event, state, control: event == "step" and seen.append(state.lr)])
    # the lr after each step: 2 steps per epoch, multiplied by 0.9 after every epoch
    assert seen == pytest.approx([1.0, 0.9, 0.9, 0.81, 0.81, 0.729])


def test_cli_unknown_config_key(tmp_path, capsys):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"learning_rate": 1}))
    assert main(["finetune", "--config", str(config), "--out", str(tmp_path / "o")]) == 2
    assert "unknown option(s) learning_rate" in capsys.readouterr().err


# --- bfloat16 checkpoints: float32 master weights ----------------------------------------------------------

@pytest.fixture(scope="module")
def bert4_bf16(bert4, tmp_path_factory):
    """The same tiny BERT saved in bfloat16 (as a duplication export from a GPU-loaded model is)."""
    path = tmp_path_factory.mktemp("bert4_bf16")
    AutoModelForMaskedLM.from_pretrained(bert4, dtype=torch.bfloat16).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def _changed_fraction(before: dict, after: dict) -> float:
    total = changed = 0
    for name, value in before.items():
        if name.startswith("pooler."):
            continue
        total += value.numel()
        changed += int((after[name].float() != value.float()).sum())
    return changed / total


BF16_UNITS = pytest.mark.parametrize("units, mode", [("1", "bfloat16"), ("0", "float32")])


@BF16_UNITS
def test_a_bfloat16_checkpoint_is_fine_tuned_in_float32(bert4_bf16, tmp_path, monkeypatch, units, mode):
    """6 steps at lr 2e-5 change > 90% of the encoder's values (bf16 parameters trained directly: ~15%), in bf16
    autocast (a CPU with bf16 units, forced) as in float32: the master weights are float32 either way."""
    from safetensors.torch import load_file
    from transformers import AutoModel

    monkeypatch.setenv("LAYERLENS_BF16_UNITS", units)
    before = {k: v.clone() for k, v in AutoModel.from_pretrained(bert4_bf16).state_dict().items()}
    splits = Splits(synthetic(48), synthetic(16, seed=1))
    config = FinetuneConfig(epochs=1, batch_size=8, lr=2e-5, warmup=0.0, save_vectors=False)
    metrics = run_finetune(ModelSpec(str(bert4_bf16), device="cpu"), splits, config, tmp_path)
    assert metrics["steps"] == 6 and metrics["autocast"] == mode
    assert json.loads((tmp_path / "metrics.json").read_text())["autocast"] == mode
    saved = load_file(tmp_path / "checkpoint" / "encoder" / "model.safetensors")
    assert {v.dtype for v in saved.values()} == {torch.float32}  # documented: checkpoints are float32
    assert _changed_fraction(before, {k.removeprefix("bert."): v for k, v in saved.items()}) > 0.9
    model, _, meta = load_checkpoint(tmp_path / "checkpoint")
    assert meta["dtype"] == "float32" and next(model.encoder.parameters()).dtype == torch.float32


@BF16_UNITS
def test_further_pretraining_of_a_bfloat16_checkpoint_is_float32(bert4_bf16, tmp_path, monkeypatch, units, mode):
    from safetensors.torch import load_file
    from transformers import AutoModelForMaskedLM as MLM

    monkeypatch.setenv("LAYERLENS_BF16_UNITS", units)
    logged = []
    before = MLM.from_pretrained(bert4_bf16).state_dict()
    further = further_pretrain(ModelSpec(str(bert4_bf16), device="cpu", dtype="bfloat16"), synthetic(32).texts, 6,
                               tmp_path / "fp", batch_size=8, lr=2e-5, log=logged.append)
    saved = load_file(further / "model.safetensors")
    assert {v.dtype for v in saved.values()} == {torch.float32}
    encoder = {k: v for k, v in before.items() if k.startswith("bert.") and k in saved}
    assert _changed_fraction(encoder, saved) > 0.9
    assert f"({mode})" in logged[-1]


@BF16_UNITS
def test_training_runs_its_products_in_the_policy_s_precision_and_evaluates_in_float32(bert4, monkeypatch, units,
                                                                                        mode):
    """LAYERLENS_BF16_UNITS=1: the training forward's products are bfloat16 (autocast), the master weights and
    gradients float32; =0: float32 throughout (autocast not entered). Evaluation is float32 in both."""
    monkeypatch.setenv("LAYERLENS_BF16_UNITS", units)
    encoder, tok = load_encoder(ModelSpec(str(bert4), device="cpu"))
    model = Classifier(encoder, "attention", 2)
    seen = {True: set(), False: set()}  # module.training -> dtypes of the query projection's output
    query = model.encoder.encoder.layer[0].attention.self.query
    hook = query.register_forward_hook(lambda m, args, out: seen[m.training].add(out.dtype))
    grads = set()
    for p in model.parameters():
        p.register_hook(lambda g: grads.add(g.dtype))
    data = prepare(tok, synthetic(32), {"neg": 0, "pos": 1}, 32, "head")
    config = FinetuneConfig(epochs=1, batch_size=8, max_steps=2, save_vectors=False)
    try:
        model, state = train(model, data, data.subset(range(8)), config, tok.pad_token_id, "cpu")
    finally:
        hook.remove()
    assert state.autocast == mode and state.step == 2
    assert seen == {True: {torch.bfloat16 if units == "1" else torch.float32}, False: {torch.float32}}
    assert grads == {torch.float32} and {p.dtype for p in model.parameters()} == {torch.float32}
    with torch.no_grad():  # the returned model computes in float32 (no autocast left on its forward)
        out = model(torch.tensor([[2, 5, 9, 3]]), torch.ones(1, 4, dtype=torch.long))
    assert out.logits.dtype == torch.float32


def test_cross_validation_never_chooses_the_epoch_on_the_rows_it_scores(bert4, tmp_path):
    """With early stopping, each fold picks its epoch on a validation split of its own training rows; the
    held-out fold is only scored. The per-epoch evaluation files name the rows that chose the epoch."""
    data = synthetic(36)
    config = FinetuneConfig(folds=3, epochs=2, batch_size=8, early_stopping=True, patience=1, val_fraction=0.25)
    metrics = run_finetune(ModelSpec(str(bert4), device="cpu"), Splits(data), config, tmp_path)
    assert "training rows of each fold" in metrics["epoch_chosen_on"]
    scored_all = []
    for k, fold in enumerate(metrics["folds"]):
        rows = json.loads((tmp_path / "folds" / str(k) / "rows.json").read_text())
        chose = set(json.loads((tmp_path / "folds" / str(k) / "epochs" / "1" / "val_ids.json").read_text())
                    ["example_id"])
        assert chose == set(rows["chose_epoch"]) and chose  # what the epochs were evaluated on
        assert chose.isdisjoint(rows["scored"])
        assert fold["epoch_rows"] == len(chose) and fold["scored_rows"] == len(rows["scored"])
        scored_all += rows["scored"]
    assert sorted(scored_all) == list(range(36))  # every row scored once, out of fold
