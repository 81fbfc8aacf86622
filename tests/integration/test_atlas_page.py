"""The Token atlas page's *Map renderer* radio says what is shown (issue 34, Low): a browser that answered without
WebGPU gets the density view, and the radio shows that view, disabled, with the reason on the Embedding Atlas
option; a browser with WebGPU keeps the choice. AppTest with the browser's answer given as the probe's state."""

import pytest

from tests.integration.test_page_tokens import corpus_root, extracted  # noqa: F401  (corpus_root is a fixture)

ATLAS, DENSITY = "Embedding Atlas (WebGPU)", "Density (datashader)"


def answer(monkeypatch, gpu):
    """The browser's answer, as the page reads it (the probe component's state), and no server started."""
    import ui.embedding_atlas as ea

    started = []
    monkeypatch.setattr(ea, "webgpu_support", lambda key: gpu)
    monkeypatch.setattr(ea, "server_for", lambda table, text="text": started.append(table) or
                        type("S", (), {"url": "http://127.0.0.1:1/token/"})())
    return started


@pytest.mark.slow  # about 10 s: an extraction and the density view
def test_without_webgpu_the_radio_shows_the_density_view_it_gets(tiny_dirs, corpus_root, monkeypatch):  # noqa: F811
    started = answer(monkeypatch, {"webgpu": False, "shader_f16": False, "reason": "no WebGPU adapter"})
    at = extracted(tiny_dirs["bert"], corpus_root)
    radio = at.radio(key="tokens_renderer")
    assert radio.value == DENSITY and radio.disabled
    assert radio.options[0] == f"{ATLAS}: not in this browser (no WebGPU adapter)"
    assert any("Shown: Density (datashader)" in c.value for c in at.caption) and at.get("plotly_chart")
    assert not started
    # the same after a rerun (another widget), and for an adapter without shader-f16
    at.selectbox(key="tokens_colour").set_value("none").run()
    assert at.radio(key="tokens_renderer").value == DENSITY and at.radio(key="tokens_renderer").disabled
    assert not at.exception and not at.error


@pytest.mark.slow
def test_a_webgpu_browser_keeps_the_choice(tiny_dirs, corpus_root, monkeypatch):  # noqa: F811
    started = answer(monkeypatch, {"webgpu": True, "shader_f16": True, "reason": ""})
    at = extracted(tiny_dirs["bert"], corpus_root)
    radio = at.radio(key="tokens_renderer")
    assert radio.value == ATLAS and not radio.disabled and radio.options == [ATLAS, DENSITY]
    assert len(started) == 1 and not at.get("plotly_chart")
    radio.set_value(DENSITY).run()
    assert at.radio(key="tokens_renderer").value == DENSITY and at.get("plotly_chart")


@pytest.mark.parametrize("gpu, reason", [
    (None, None), ({"webgpu": True, "shader_f16": True, "reason": ""}, None),
    ({"webgpu": True, "shader_f16": False, "reason": "the WebGPU adapter has no shader-f16"},
     "the WebGPU adapter has no shader-f16"),
    ({"webgpu": False, "shader_f16": False, "reason": ""}, "no WebGPU"),
])
def test_lacks_webgpu(gpu, reason):
    from ui.embedding_atlas import lacks_webgpu

    assert lacks_webgpu(gpu) == reason
