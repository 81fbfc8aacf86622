import pytest
import torch
from transformers import AutoConfig, AutoModelForMaskedLM, BertModel, GPT2Config, GPT2LMHeadModel

from models.anatomy import layer_name
from models.loading import ModelLoadError, ModelSpec, load_model, module_nbytes, resolve_device, resolve_dtype
from tests.support.models import TINY_CONFIGS, save_tiny, tiny_tokenizer


def sample_batch(tokenizer):
    return tokenizer(["the film is good .", "i hated it , very dull !"], padding=True, return_tensors="pt")


def test_anatomy_head_reproduces_model_logits_exactly(tiny_dir):
    loaded = load_model(ModelSpec(str(tiny_dir), device="cpu"))
    batch = sample_batch(loaded.tokenizer)
    out = loaded.model(**batch, output_hidden_states=True)
    assert len(out.hidden_states) == loaded.anatomy.num_layers + 1
    assert torch.equal(loaded.anatomy.head(out.hidden_states[-1]), out.logits)
    # the same numbers as a model loaded by plain transformers
    plain = AutoModelForMaskedLM.from_pretrained(tiny_dir).eval()
    assert torch.equal(plain(**batch).logits, out.logits)


def test_anatomy_layers_map_each_hidden_state_to_the_next(tiny_dirs):
    """layers[i-1] takes hidden state i-1 to hidden state i (checked on BERT, where a layer is callable alone)."""
    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    batch = sample_batch(loaded.tokenizer)
    states = loaded.model(**batch, output_hidden_states=True).hidden_states
    mask = (1.0 - batch["attention_mask"][:, None, None, :].float()) * torch.finfo(torch.float32).min
    for i, layer in enumerate(loaded.anatomy.layers, start=1):
        out = layer(states[i - 1], attention_mask=mask)
        out = out[0] if isinstance(out, tuple) else out
        torch.testing.assert_close(out, states[i])
    assert torch.equal(loaded.anatomy.embeddings(input_ids=batch["input_ids"]), states[0])


def test_albert_shares_one_layer_module_across_depth(tiny_dirs):
    anatomy = load_model(ModelSpec(str(tiny_dirs["albert"]), device="cpu")).anatomy
    assert anatomy.num_layers == TINY_CONFIGS["albert"].num_hidden_layers
    assert len({id(m) for m in anatomy.layers}) == 1


@pytest.mark.parametrize("family", sorted(TINY_CONFIGS))
def test_family_is_recognised(tiny_dirs, family):
    loaded = load_model(ModelSpec(str(tiny_dirs[family]), device="cpu"))
    expected = "roberta" if family == "xlm-roberta" else family
    assert loaded.anatomy.family == expected
    assert loaded.summary()["layers"] == AutoConfig.from_pretrained(tiny_dirs[family]).num_hidden_layers


def test_loaded_model_is_frozen_in_eval_mode(tiny_dirs):
    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    assert not loaded.model.training
    assert not any(p.requires_grad for p in loaded.model.parameters())


def test_nbytes_counts_tied_weights_once(tiny_dirs):
    model = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu")).model
    unique = {p.data_ptr(): p.numel() * p.element_size() for p in [*model.parameters(), *model.buffers()]}
    assert module_nbytes(model) == sum(unique.values())
    decoder = model.cls.predictions.decoder.weight
    assert decoder.data_ptr() == model.bert.embeddings.word_embeddings.weight.data_ptr()


def test_dtype_and_device_resolution():
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") in {"cpu", "cuda", "mps"}
    assert resolve_dtype("auto", "cpu") == "float32"
    assert resolve_dtype("float16", "cpu") == "float16"
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="no CUDA GPU"):
            resolve_device("cuda")


def test_bfloat16_load(tiny_dirs):
    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu", dtype="bfloat16"))
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    assert loaded.spec.dtype == "bfloat16"


def test_spec_round_trip_and_validation():
    spec = ModelSpec("bert-base-uncased", revision="main", device="cpu", dtype="float32")
    assert ModelSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ModelLoadError, match="no model named"):
        ModelSpec("  ")
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        ModelSpec("demo", dtype="int3")
    with pytest.raises(ModelLoadError, match="unknown device"):
        ModelSpec("demo", device="tpu")


# --- errors a person can read -------------------------------------------------------------------------------

def test_missing_local_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="is not a directory"):
        load_model(ModelSpec(str(tmp_path / "nope"), device="cpu"))


def test_hub_id_offline_and_not_cached():
    with pytest.raises(ModelLoadError, match="not in the local Hugging Face cache"):
        load_model(ModelSpec("some-org/not-a-real-model-xyz", device="cpu"))


def test_checkpoint_without_mlm_head_loads_as_an_encoder_and_the_probe_explains(tmp_path):
    from analysis.core.inputs import InputError, TextInputs
    from analysis.probe.reconstruction import probe

    BertModel(TINY_CONFIGS["bert"]).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    loaded = load_model(ModelSpec(str(tmp_path), device="cpu"))
    assert loaded.mlm_head is None and loaded.task is None
    with pytest.raises(InputError, match="no MLM head of its own \\(a bare encoder\\).*--head-from"):
        probe(loaded, TextInputs(("a film",)))


def test_electra_discriminator_is_explained(tmp_path):
    from transformers import ElectraForPreTraining

    from analysis.core.inputs import InputError, TextInputs
    from analysis.probe.reconstruction import probe

    ElectraForPreTraining(TINY_CONFIGS["electra"]).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    loaded = load_model(ModelSpec(str(tmp_path), device="cpu"))
    with pytest.raises(InputError, match="discriminator has none: use the generator"):
        probe(loaded, TextInputs(("a film",)))


def test_unsupported_architecture(tmp_path):
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=99)).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="model type 'gpt2' is not supported"):
        load_model(ModelSpec(str(tmp_path), device="cpu"))


def test_pickle_weights_need_opt_in(tmp_path):
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(TINY_CONFIGS["bert"]).eval()
    model.config.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    tiny_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="no safetensors weights.*allow pickle"):
        load_model(ModelSpec(str(tmp_path), device="cpu"))
    loaded = load_model(ModelSpec(str(tmp_path), device="cpu", allow_pickle=True))
    embeddings = loaded.model.bert.embeddings.word_embeddings.weight
    assert torch.equal(embeddings, model.bert.embeddings.word_embeddings.weight)


def test_layer_names():
    assert [layer_name(i, 3) for i in range(4)] == ["embeddings", "layer 1", "layer 2", "layer 3 (last)"]


@pytest.mark.slow
def test_save_tiny_is_deterministic(tmp_path):
    a = AutoModelForMaskedLM.from_pretrained(save_tiny("bert", tmp_path / "a"))
    b = AutoModelForMaskedLM.from_pretrained(save_tiny("bert", tmp_path / "b"))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_random_weights_are_the_architecture_seeded_as_transformers_initialises_it():
    """random:NAME (the control of a random-weights model): NAME's config and tokenizer, every weight equal to a
    plain seeded AutoModelForMaskedLM.from_config, the caller's random state untouched."""
    import torch
    from transformers import AutoConfig, AutoModelForMaskedLM

    from models.spec import DEMO_DIR, RANDOM_SEED

    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    loaded = load_model(ModelSpec("random:demo", device="cpu", dtype="float32"))
    assert torch.equal(torch.random.get_rng_state(), before)
    torch.manual_seed(RANDOM_SEED)
    plain = AutoModelForMaskedLM.from_config(AutoConfig.from_pretrained(DEMO_DIR)).eval()
    ours = loaded.model.state_dict()
    assert ours.keys() == plain.state_dict().keys()
    for name, value in plain.state_dict().items():
        assert torch.equal(ours[name], value), name
    trained = load_model(ModelSpec("demo", device="cpu", dtype="float32"))
    assert not torch.equal(ours["bert.encoder.layer.0.attention.self.query.weight"],
                           trained.model.state_dict()["bert.encoder.layer.0.attention.self.query.weight"])
    assert loaded.tokenizer.get_vocab() == trained.tokenizer.get_vocab() and loaded.mlm_head == "own"
    assert loaded.weights_id != trained.weights_id and loaded.weights_id.startswith("random(seed 0")
    again = load_model(ModelSpec("random:demo", device="cpu", dtype="float32"))
    assert all(torch.equal(v, again.model.state_dict()[k]) for k, v in ours.items())


def test_random_needs_a_model_name():
    with pytest.raises(ModelLoadError, match="random:demo"):
        ModelSpec("random:")


HUB_ATTEMPTS = """
import json, socket, sys
from huggingface_hub.utils import get_session
requests, connects = [], []
hooks = get_session().event_hooks  # every request huggingface_hub (and transformers through it) sends, retries too
get_session().event_hooks = {**hooks, "request": [*hooks["request"], lambda r: requests.append(f"{r.method} {r.url}")]}
real = socket.socket.connect
def connect(self, address):  # every TCP connection the process attempts, whoever makes it
    connects.append(list(address[:2]) if isinstance(address, tuple) else str(address))
    return real(self, address)
socket.socket.connect = connect
from models.loading import ModelLoadError, ModelSpec, load_model
try:
    loaded = load_model(ModelSpec(sys.argv[1], device="cpu"))
    message = "loaded " + loaded.anatomy.family
except ModelLoadError as exc:
    message = str(exc)
print(json.dumps({"message": message, "requests": requests, "connects": connects}))
"""
OFFLINE_MESSAGE = "is not in the local Hugging Face cache and the hub cannot be reached"


def load_in_a_process(name: str, tmp_path, **env) -> dict:
    """Load ``name`` in a fresh Python process with an empty Hugging Face cache and ``env`` (HF_HUB_OFFLINE is not
    inherited from the tests' own setting); what it said, the hub requests and the TCP connections it attempted."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    base = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    base.update(HF_HOME=str(tmp_path / "hf_home"), PYTHONPATH=str(Path(__file__).resolve().parents[3]))
    done = subprocess.run([sys.executable, "-c", HUB_ATTEMPTS, name], env={**base, **env}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def closed_port() -> int:
    import socket

    with socket.socket() as s:  # a port nothing listens on once this closes
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # a fresh Python process importing torch and transformers
def test_an_uncached_hub_name_is_refused_without_retries_when_the_hub_is_unreachable(tmp_path):
    """The hub out of reach but offline mode not set (HF_ENDPOINT at a closed port): huggingface_hub would try each
    file 6 times, backing off 23 s in all; the name is refused after one probe of the endpoint."""
    endpoint = f"http://127.0.0.1:{closed_port()}"
    said = load_in_a_process("some-org/mistyped-model-xyz", tmp_path, HF_ENDPOINT=endpoint)
    assert OFFLINE_MESSAGE in said["message"]
    assert not [r for r in said["requests"] if "mistyped-model-xyz" in r], said["requests"]  # no file asked for
    assert [r.rstrip("/") for r in said["requests"]].count(f"HEAD {endpoint}") <= 1  # the endpoint probed once


@pytest.mark.slow  # a fresh Python process importing torch and transformers
def test_an_uncached_hub_name_is_refused_without_a_connection_in_offline_mode(tmp_path):
    said = load_in_a_process("some-org/mistyped-model-xyz", tmp_path, HF_HUB_OFFLINE="1")
    assert OFFLINE_MESSAGE in said["message"] and said["requests"] == [] and said["connects"] == []


@pytest.mark.slow  # a fresh Python process importing torch and transformers
def test_a_cached_hub_model_loads_without_retries_when_the_hub_is_unreachable(tmp_path):
    """A hub model already in the local cache still loads with the hub out of reach, from the cache alone."""
    from tests.support.models import save_tiny

    repo = tmp_path / "hf_home" / "hub" / "models--layerlens-test--cached-bert"
    commit = "0123456789abcdef0123456789abcdef01234567"
    save_tiny("bert", repo / "snapshots" / commit, copy_steps=0)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    endpoint = f"http://127.0.0.1:{closed_port()}"
    said = load_in_a_process("layerlens-test/cached-bert", tmp_path, HF_ENDPOINT=endpoint)
    assert said["message"] == "loaded bert"
    assert not [r for r in said["requests"] if "cached-bert" in r], said["requests"]
    assert [r.rstrip("/") for r in said["requests"]].count(f"HEAD {endpoint}") <= 1


def test_short_names_never_show_the_servers_path(tmp_path):
    """Issue 43 (low): legends and captions showed the server's absolute paths."""
    from models.spec import short_name

    (tmp_path / "sst2-seed3" / "model").mkdir(parents=True)
    (tmp_path / "my-bert").mkdir()
    assert short_name(str(tmp_path / "my-bert")) == "my-bert"
    assert short_name(str(tmp_path / "sst2-seed3" / "model")) == "sst2-seed3/model"  # a generic folder: its parent
    assert short_name("bert-base-uncased") == "bert-base-uncased" and short_name("org/name") == "org/name"
    assert short_name("random:demo") == "random:demo" and short_name("/gone/elsewhere") == "elsewhere"
