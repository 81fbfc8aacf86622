"""Tiny randomly initialised masked LMs built from configs: no downloads anywhere in the tests."""

from __future__ import annotations

import functools
import os
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: any hub access fails fast
os.environ["LAYERLENS_HOME"] = tempfile.mkdtemp(prefix="layerlens-home-")  # never the user's own cache
os.environ.setdefault("LAYERLENS_MODEL_DIRS", tempfile.gettempdir())  # the tests' tiny models live in pytest's tmp
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the same numbers on every machine: float32 unless a test asks for the bf16 paths (LAYERLENS_BF16_UNITS=1)
os.environ.setdefault("LAYERLENS_BF16_UNITS", "0")
# `make test-all` runs the slow tests in pytest-xdist workers: each worker's torch, and every process it starts, gets
# its share of the cores (two workers of two threads each on two cores took 7 min for 3 min of tests)
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("OMP_NUM_THREADS",
                          str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import (  # noqa: E402
    AlbertConfig,
    AutoModelForMaskedLM,
    BertConfig,
    BertTokenizerFast,
    DistilBertConfig,
    ElectraConfig,
    RobertaConfig,
    XLMRobertaConfig,
)

# The project's shared datasets live beside the checkout on our own machines (../shared/data;
# LAYERLENS_SHARED_DATA overrides). Only the demo model's full quality check reads them; every other test reads
# the small cuts in tests/data (see tests/data/README.md).
SHARED_DATA = Path(os.environ.get("LAYERLENS_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
FIXTURES = Path(__file__).resolve().parent / "data"


def shared_file(relative: str) -> Path:
    """A file under the shared data, or a skip saying it is missing; a failure when LAYERLENS_REQUIRE_SHARED=1
    (as in CI, where a missing file must not pass as a skip)."""
    path = SHARED_DATA / relative
    if not path.is_file():
        message = f"needs {path} (the shared datasets beside the checkout; set LAYERLENS_SHARED_DATA)"
        if os.environ.get("LAYERLENS_REQUIRE_SHARED") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path
VOCAB = 99
COMMON = dict(vocab_size=VOCAB, max_position_embeddings=64, pad_token_id=0)

TINY_CONFIGS = {
    "bert": BertConfig(hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=32, **COMMON),
    "albert": AlbertConfig(embedding_size=8, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                           intermediate_size=32, **COMMON),
    "roberta": RobertaConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                             **{**COMMON, "pad_token_id": 1}),
    "xlm-roberta": XLMRobertaConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                    intermediate_size=32, **{**COMMON, "pad_token_id": 1}),
    "distilbert": DistilBertConfig(dim=16, n_layers=2, n_heads=2, hidden_dim=32, **COMMON),
    "electra": ElectraConfig(embedding_size=8, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=32, **COMMON),
}


def tiny_tokenizer() -> BertTokenizerFast:
    """A WordPiece tokenizer over the first ``VOCAB`` ids of a tiny vocabulary (specials + common words)."""
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "film", "is", "good", "bad", "not", "very",
             "movie", "and", "it", "was", "i", "liked", "hated", ".", ",", "!", "?", "##s", "##ing", "fun", "dull"]
    words += [f"w{i}" for i in range(VOCAB - len(words))]
    return BertTokenizerFast(vocab={w: i for i, w in enumerate(words)}, do_lower_case=True)


def save_tiny(family: str, directory: Path, seed: int = 0, copy_steps: int = 40) -> Path:
    """Save a tiny ``family`` masked LM and a tokenizer as a ``save_pretrained`` directory.

    The weights are random, then nudged for ``copy_steps`` Adam steps towards reconstructing their input, so
    that layer accuracies are neither all 0 nor all 1 and the probe's tests have something to compare.
    """
    torch.manual_seed(seed)
    model = AutoModelForMaskedLM.from_config(TINY_CONFIGS[family])
    if copy_steps:
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        model.train()
        for _ in range(copy_steps):
            ids = torch.randint(5, VOCAB, (8, 12))
            logits = model(input_ids=ids).logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad()
    model.eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """family -> directory holding a tiny random masked LM of that family."""
    root = tmp_path_factory.mktemp("tiny_models")
    return {family: save_tiny(family, root / family) for family in TINY_CONFIGS}


@pytest.fixture(params=sorted(TINY_CONFIGS))
def tiny_dir(request, tiny_dirs) -> Path:
    return tiny_dirs[request.param]


@pytest.fixture(autouse=True)
def _full_streamlit_errors():
    """Show the real error in AppTest failures (the dashboard itself redacts them)."""
    from streamlit import config

    config.set_option("client.showErrorDetails", "full")
    yield


@pytest.fixture(autouse=True)
def _no_uploads_left_behind():
    """Every test starts without uploads: the session's LAYERLENS_HOME is shared, and a page lists the uploads
    folder (an upload saved by one test would otherwise show up as another page's first table)."""
    import shutil

    from analysis.core.dataroots import uploads

    yield
    shutil.rmtree(uploads(), ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item):
    """A job worker, a Slurm job or a server started in a test's own folder is killed when the test ends, passed or
    failed (before its fixtures are torn down): one left running (a 100,000-epoch job whose kill missed) took a core
    from every later test."""
    folder = getattr(item, "funcargs", {}).get("tmp_path")
    if folder is not None:
        kill_processes_under(folder)


def kill_processes_under(folder: Path) -> list[int]:
    """SIGKILL every process of this user whose command line names ``folder`` (Linux's /proc; elsewhere none)."""
    import signal

    proc, needle, killed = Path("/proc"), str(folder), []
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            words = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(w == needle or w.startswith(needle + os.sep) for w in words):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
            except OSError:
                pass
    return killed


# Tests that take more than ~5 s each: `make test` runs `pytest -m "not slow"`, `make test-all` (and CI) everything.
SLOW_MODULES = {"test_browser", "test_parallel", "test_demo_model", "test_backends", "test_job_faults"}
SLOW_TESTS = {"test_the_cli_writes_the_five_files_and_refuses_in_one_line",
              "test_the_page_shows_the_engines_layer_summary_and_refuses_other_tokenizers",
              "test_a_probe_killed_midway_keeps_the_previous_result", "test_concurrent_mixed_traffic_keeps_budget",
              "test_nonlinear_methods_give_finite_coordinates", "test_a_killed_worker_never_blocks_the_queue",
              "test_ctrl_c_checkpoints_and_the_same_command_resumes", "test_submit_runs_to_success_with_artifacts",
              "test_a_lens_job_runs_through_the_store_and_is_found_for_the_model",
              "test_a_read_only_out_is_one_line", "test_submit_starts_a_worker_that_runs_the_job",
              "test_cancel_stops_a_running_job_within_seconds",
              "test_a_cancelled_lens_job_is_listed_as_partial_and_the_same_options_resume_it",
              "test_a_sigkill_between_the_files_of_a_checkpoint_never_mixes_steps",
              "test_values_the_run_would_refuse_are_refused_on_the_page",
              "test_an_upload_that_fails_midway_leaves_nothing_offered",
              "test_structure_page_shows_the_engine_numbers", "test_a_local_job_writes_what_the_cli_writes",
              "test_a_cancelled_job_stops_and_is_marked_cancelled",
              # measured over 5 s each on 2026-11-26 (make test under 5 minutes: issue 35)
              "test_the_summary_says_what_its_intervals_cover_and_seeds_widen_them",
              "test_the_demo_models_exact_tables_are_the_float32_tables",
              "test_movers_carry_each_models_out_of_fold_probe_prediction_and_a_classifiers_own_prediction",
              "test_run_json_names_the_mode_and_an_approximate_run_states_its_agreement_with_float32",
              "test_the_projection_is_its_own_stage_of_the_progress", "test_every_family_trains_and_reloads",
              "test_the_jobs_page_opens_a_jobs_epochs_and_a_group_on_the_compare_page",
              "test_a_fine_tuning_jobs_classifier_on_its_held_out_rows", "test_finished_runs_are_compared_and_voted",
              "test_the_neighbour_tables_are_the_engines", "test_the_random_weights_control_is_a_second_model",
              "test_the_cka_interval_is_a_jackknife_around_the_estimate_even_with_few_rows",
              "test_a_classifier_is_read_with_the_head_named_for_b_and_its_own_predictions_shown",
              "test_two_sessions_probing_one_cached_model_at_once_agree",
              "test_the_cli_reads_job_models_and_lends_a_head_with_head_from",
              "test_a_sweep_from_the_page_queues_its_jobs_in_one_group_and_compares_by_group",
              "test_an_untrained_lens_is_exactly_the_raw_probe",
              # the two slowest lean tests of session 14 (15 s and more each, idle), and the heads job's resume
              "test_further_pretraining_lowers_the_task_mlm_loss", "test_atlas_records_the_variance_of_each_pca_panel",
              "test_a_cancelled_stats_job_submitted_again_resumes_and_writes_what_the_cli_writes",
              # the slowest lean tests of a full lean run on 2026-11-26 (2-6 s each, 40 s together): a fresh clone's
              # `make test` measured 5 min 17 s with them (tests 3 min 14 s, installing about 2 min)
              "test_a_crash_is_failed_with_the_log_tail", "test_a_second_model_of_another_depth_keeps_its_own_layers",
              "test_job_code_does_not_import_the_cli", "test_pairs_mean_pooling_and_a_second_model",
              "test_titles_name_the_pooling_and_the_pca_variance_and_the_times_are_split",
              "test_atlas_page_shows_the_engine_numbers", "test_an_easy_task_is_learned",
              "test_the_page_submits_a_structure_job_and_opens_its_results",
              "test_the_atlas_and_probe_second_model_fields_open_the_compare_page",
              "test_a_corpus_without_tokens_and_words_not_in_it_are_one_message_each",
              "test_the_cli_compares_a_jobs_epochs_and_a_group_and_refuses_in_one_line",
              "test_an_incompatible_mlm_head_blocks_only_the_pages_that_need_a_head",
              "test_a_model_against_itself_and_against_one_of_another_depth",
              # the slowest lean tests of session 15 (0.85-2.2 s each, 19 s together; each page keeps a lean test):
              # a fresh clone's `make test` measured 5 min 21 s with them (tests 2 min 26 s, installing about 2.9 min)
              "test_a_tuned_lens_overlays_raw_and_tuned_readings", "test_a_webgpu_browser_keeps_the_choice",
              "test_the_atlas_comparison_uses_the_jobs_held_out_rows",
              "test_a_jobs_epochs_against_its_base_from_the_vectors_on_disk",
              "test_a_lens_of_both_halves_reads_the_attention_halves_on_the_page",
              "test_umap_waits_for_a_click_then_runs_under_its_own_progress_and_a_stop",
              "test_the_geometry_tables_are_the_engines", "test_the_structure_page_opens_the_heads_on_its_treebank",
              "test_a_preset_gives_the_same_options_from_the_cli_a_config_file_a_job_and_the_page",
              "test_the_ensemble_baseline_is_the_runs_own_training_majority",
              "test_an_approximate_atlas_states_its_cka_with_float32_per_layer", "test_lru_eviction_under_budget",
              "test_valid_plans_parse_back", "test_a_job_whose_artifacts_were_deleted_says_so",
              "test_importance_of_a_fine_tuning_jobs_classifier_from_the_cli", "test_save_tiny_is_deterministic",
              "test_jobs_list_reads_a_read_only_home"}


def pytest_configure(config):
    """Each new Streamlit ``AppTest`` scans every installed distribution's metadata for components (0.39 s here, on
    each of the page tests: about 30 s of `make test`). The installed packages do not change during a test run, so
    the scan runs once per process and every AppTest gets its result."""
    try:
        from streamlit.components.v2 import manifest_scanner
    except ImportError:  # another Streamlit: it scans as it does
        return
    manifest_scanner.scan_component_manifests = functools.cache(manifest_scanner.scan_component_manifests)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__.rsplit(".", 1)[-1] in SLOW_MODULES or item.originalname in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
