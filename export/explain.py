"""`python -m export --explain SOURCE`: what the export would serve, one fact a line with where it was read, before
anything is exported (export/reading.py reads it; the export then serves exactly that)."""

from __future__ import annotations

import json

from common.engine_choice import choose_engine
from export.reading import Reading
from settings.schema import Settings


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None or value == {} or value == []:
        return "none"
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def explain(reading: Reading, settings: Settings) -> str:
    """The reading as a table: fact, value, source; then the precision this machine would serve at, and notes."""
    engine = settings.engine
    choice = choose_engine(engine.kind, engine.precision, bool(settings.encoder.gpus), reading.task)
    rows = [(name, _value(fact.value), fact.source) for name, fact in reading.facts.items()]
    rows.append(
        (
            "precision",
            f"{choice.precision} on {choice.kind} ({choice.reason})",
            f'settings: engine.kind = "{settings.engine.kind}", engine.precision = "{settings.engine.precision}"',
        )
    )
    width = max(len(name) for name, _, _ in rows)
    value_width = min(max(len(value) for _, value, _ in rows), 48)
    source = reading.checkpoint.source
    lines = [f"{source}, exported for task {reading.task}, would be served as:"]
    lines += [f"  {name:<{width}}  {value:<{value_width}}  {where}" for name, value, where in rows]
    lines += [f"  note: {note}" for note in reading.notes]
    return "\n".join(lines)
