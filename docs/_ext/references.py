"""Sphinx extension: writes ``reference/configuration.md`` and ``reference/metrics.md`` before each build, from the
declarations themselves: the ``help`` metadata of :mod:`dapo.settings`' dataclass fields, the ``key`` and ``help``
metadata of :mod:`recipe.embedded.config`'s sections, and :data:`dapo.metrics.METRIC_DOCS`. Nothing in them is
written by hand; change a ``help`` string and the page changes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

SETTINGS = (
    "RunSettings",
    "LossSettings",
    "FilterSettings",
    "SamplingSettings",
    "OverlongSettings",
    "EntropyWatchSettings",
    "EntrySettings",
)
ROOT = Path(__file__).resolve().parents[2]


def _cell(text) -> str:
    # a table cell on one line; | would end the cell and <word> would be read as an HTML tag (and vanish)
    return " ".join(str(text).split()).replace("|", "\\|").replace("<", "\\<")


def _yaml_value(value) -> str:
    """``value`` as YAML writes it (``true``, ``null``, ``0.25``)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return f"{value:g}" if isinstance(value, float) else str(value)


def knobs() -> list[tuple[str, object, str]]:
    """``(key, default, meaning)`` of every ``dapo.*`` knob, from the declarations (:func:`dapo.settings.setting`)
    in :mod:`dapo.settings` and :mod:`recipe.common.watchdog`: the default is ``configs/dapo_trainer.yaml``'s, or
    the declaration's where the file leaves the key out."""
    import yaml

    import dapo.settings as settings
    from recipe.common.watchdog import WatchdogSettings

    composed = yaml.safe_load((ROOT / "configs" / "dapo_trainer.yaml").read_text())
    out = []
    for cls in [*(getattr(settings, name) for name in SETTINGS), WatchdogSettings]:
        for field in dataclasses.fields(cls):
            key = field.metadata.get("key", "")
            if not key.startswith("dapo."):
                continue
            node, found = composed, True
            for part in key.split("."):
                found = isinstance(node, dict) and part in node
                node = node[part] if found else None
                if not found:
                    break
            default = (
                f"`{_yaml_value(node)}`" if found else f"`{_yaml_value(field.default)}` (not in the yaml: `+{key}=`)"
            )
            out.append((key, default, field.metadata["help"]))
    return out


def configuration_page() -> str:
    import dapo.settings as settings
    import recipe.embedded.config as embedded_config

    lines = [
        "# Configuration reference",
        "",
        "Generated from the declarations (`dapo.settings.setting`: key, meaning, default) of the dataclasses in "
        "`dapo.settings`, the contract both engines build from the composed config (keys are verl's; a key missing "
        "from the config takes the default).",
        "",
        "## DAPO knobs verl has no key for (`dapo:` in `configs/dapo_trainer.yaml`)",
        "",
        "| key | default | meaning |",
        "| --- | --- | --- |",
        *(f"| `{key}` | {default} | {_cell(help)} |" for key, default, help in knobs()),
        "",
    ]
    for name in SETTINGS:
        cls = getattr(settings, name)
        lines += [
            f"## `{name}`",
            "",
            _cell((cls.__doc__ or "").strip().split("\n\n")[0]),
            "",
            "| field | default | meaning |",
            "| --- | --- | --- |",
        ]
        for field in dataclasses.fields(cls):
            default = field.default if field.default is not dataclasses.MISSING else "(required)"
            key = f"`{field.metadata['key']}`: " if "key" in field.metadata else ""
            lines.append(f"| `{field.name}` | `{default!r}` | {key}{_cell(field.metadata.get('help', ''))} |")
        lines.append("")
    from recipe.common.watchdog import WatchdogSettings

    lines += [
        "## `WatchdogSettings` (`dapo.watchdog.*`)",
        "",
        _cell((WatchdogSettings.__doc__ or "").strip().split("\n\n")[0]) + " Both engines; `recipe.common.watchdog`.",
        "",
        "| field | default | meaning |",
        "| --- | --- | --- |",
    ]
    for field in dataclasses.fields(WatchdogSettings):
        lines.append(f"| `{field.name}` | `{field.default!r}` | {_cell(field.metadata.get('help', ''))} |")
    lines += [
        "",
        "## The embedded engine's sections",
        "",
        "Generated from the field metadata of `recipe.embedded.config`: every key the embedded engine reads, "
        "by section. Defaults are the composed config's (`configs/embedded.yaml` over `configs/dapo_trainer.yaml` "
        "over verl's `ppo_trainer`); a key missing from the config is refused, naming it. Keys marked *shared* "
        "are declared once, in `dapo.settings` above (key, meaning, check), for both engines; the embedded engine "
        "refuses a config that lacks one where `dapo.settings` would take its default.",
        "",
    ]
    for cls in embedded_config.SECTIONS:
        lines += [
            f"### `{cls.__name__}`",
            "",
            _cell((cls.__doc__ or "").strip()),
            "",
            "| field | key | meaning |",
            "| --- | --- | --- |",
        ]
        for field in dataclasses.fields(cls):
            shared = " *(shared)*" if field.metadata["shared"] else ""
            lines.append(f"| `{field.name}` | `{field.metadata['key']}` | {_cell(field.metadata['help'])}{shared} |")
        lines.append("")
    return "\n".join(lines)


def metrics_page() -> str:
    from dapo.metrics import METRIC_DOCS

    lines = [
        "# Metrics reference",
        "",
        "Generated from `dapo.metrics.METRIC_DOCS`: every metric the engines log, what it means and what "
        "healthy looks like. Both engines log these names (verl's where verl has the quantity); W&B shows them "
        "with `trainer.logger=[console,wandb]`. On the verl engine the loss's own metrics get verl's `actor/` "
        "prefix (`actor/dapo/clipfrac_high`).",
        "",
        "| metric | meaning |",
        "| --- | --- |",
    ]
    lines += [f"| `{name}` | {_cell(text)} |" for name, text in METRIC_DOCS.items()]
    return "\n".join(lines) + "\n"


PAGES = {"configuration.md": configuration_page, "metrics.md": metrics_page}


def write(out: Path) -> list[str]:
    """Write the pages into ``out``; return the names that changed."""
    out.mkdir(exist_ok=True)
    changed = []
    for name, page in PAGES.items():
        path, text = out / name, page()
        if not path.is_file() or path.read_text() != text:  # unchanged pages keep their mtime: no rebuild
            path.write_text(text)
            changed.append(name)
    return changed


def write_references(app) -> None:
    write(Path(app.srcdir) / "reference")


def setup(app):
    app.connect("builder-inited", write_references)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":  # python docs/_ext/references.py: refresh the committed pages (a test checks they are)
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    changed = write(Path(__file__).resolve().parents[1] / "reference")
    print(f"docs/reference: {', '.join(changed) or 'up to date'}")
