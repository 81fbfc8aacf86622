"""Which hidden states an analysis reads: ``all``, a slice or a list, in Hugging Face's numbering (0 = the
embeddings, ``L`` = the last layer)."""

from __future__ import annotations

from analysis.core.inputs import InputError


def parse_layers(spec: str, n_states: int) -> list[int]:
    """Hidden-state indices from ``"all"``, a slice (``"-6:"``, ``"2:8"``) or a list (``"0,4,8"``; negatives count
    from the end). ``n_states`` is ``L + 1``."""
    text = (spec or "").strip().lower()
    if not text:
        raise InputError(f"no layers given: use all, a slice such as -6: or a list such as 0,4,8 (hidden states "
                         f"0..{n_states - 1})")
    try:
        if text == "all":
            chosen = list(range(n_states))
        elif ":" in text:
            parts = [int(p) if p.strip() else None for p in text.split(":")]
            if len(parts) > 3:
                raise ValueError
            # "-6:" on a model with fewer states means all of them (layers_note says so); any other bound
            # outside the model is an error, not a quietly clamped slice
            outside = [b for i, b in enumerate(parts[:2]) if b is not None and not -n_states <= b <= n_states
                       and not (i == 0 and b < 0 and (len(parts) < 2 or parts[1] is None))]
            if outside:
                raise InputError(f"layer {outside[0]} in '{spec}' does not exist: this model has hidden states "
                                 f"0..{n_states - 1} (-{n_states}..-1 from the end)")
            chosen = list(range(n_states))[slice(*parts)]
        else:
            chosen = []
            for p in text.split(","):
                i = int(p)
                if not -n_states <= i < n_states:
                    raise InputError(f"layer {i} does not exist: this model has hidden states 0..{n_states - 1}")
                chosen.append(i % n_states)
    except InputError:
        raise
    except ValueError:
        raise InputError(f"cannot read layers '{spec}': use all, a slice such as -6: or a list such as 0,4,8") from None
    chosen = list(dict.fromkeys(chosen))
    if not chosen:
        raise InputError(f"layers '{spec}' selects no layer of 0..{n_states - 1}")
    return chosen


def layers_note(spec: str, n_states: int) -> str | None:
    """What to tell the user when ``spec`` asks for more of the last layers than the model has (``-6:`` on 5
    hidden states: all 5 are used)."""
    text = (spec or "").strip()
    if text.startswith("-") and text.endswith(":") and text[1:-1].isdigit() and int(text[1:-1]) > n_states:
        return f"layers {text} asks for the last {text[1:-1]} hidden states; this model has {n_states}: all are shown"
    return None
