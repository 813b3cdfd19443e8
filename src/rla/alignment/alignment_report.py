"""What ``rla.align`` did to a model: a small dataclass that prints as a table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from rla.profiles import REGIONS, RoundingProfile

__all__ = ["AlignmentReport", "FixedHazard"]


@dataclass(frozen=True)
class FixedHazard:
    """A precision hazard outside the rounding points that aligning fixed (docs/rounding.md)."""

    name: str
    detail: str


def _rounding(profile: RoundingProfile, region: str) -> str:
    if region == "rope":
        return (f"cos/sin {profile.rope_cos_sin}, apply {profile.rope_apply}, inv_freq on "
                f"{profile.rope_inv_freq}, q/k-norm out {profile.qk_norm_out}")
    if region == "swiglu":
        return profile.swiglu
    if region == "router":
        r = profile.router
        return "HF's own values" if r is None else ", ".join(f"{k} {v}" for k, v in r.points().items())
    return (f"weight {profile.norm_weight}, residual {profile.norm_residual}, "
            f"stream {profile.residual_stream}")


@dataclass
class AlignmentReport:
    """Profile, regions and what was aligned; ``str(report)`` is a short table.

    ``counts[region]`` maps a kind of module to how many were aligned, e.g.
    ``{"rope": {"rotary_emb": 1, "self_attn": 2}, ...}``; regions not aligned are absent.
    """

    profile: RoundingProfile
    regions: tuple[str, ...]
    family: str
    model_class: str
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    hazards: list[FixedHazard] = field(default_factory=list)
    transformers_version: str = ""
    ops: str = "rla.ops"
    """Which implementation runs the region ops' forward (``rla.ops``, or an engine's kernels)."""
    notes: list[str] = field(default_factory=list)
    """Things the user should know that are not hazards, e.g. that nothing can round yet."""
    variant: str = ""
    """The rows' variant (``rla.profiles.VARIANTS``) whose points hold for this family's modules
    (empty: the row's own points); the table prints the points that ran."""
    experts_variant: str = ""
    """The rows' variant whose points hold for the routed experts' gated product (``moe_experts``:
    the engine runs them inside its fused-MoE op) where it changes a point of :meth:`ran`; empty
    otherwise. The table's swiglu row prints both values."""
    moe_out: str = ""
    """``fp32`` where the MoE blocks hand the residual add their fp32 shared + routed sum (the row's
    ``moe_experts`` variant point ``moe_out``, ``rla.alignment.moe_out``); empty otherwise (the sum rounded,
    HF's). The table's rmsnorm row prints it."""
    head_size: int | None = None
    """The model's attention head size where the row's points depend on it
    (``RoundingProfile.conditions``) and differ there; the table prints the points that ran."""
    lm_head: str = ""
    """What the alignment did to the LM head (``rla.alignment.lm_head``): aligned to the row's
    ``lm_head`` point, or left as it is because it already computes it; every alignment sets it."""
    profile_choice: str = ""
    """How an engine alias (``"vllm"``) became this row: the engine version it was matched to and
    where that version came from (:meth:`rla.profiles.EngineMatch.message`); empty for a row name."""

    def ran(self) -> RoundingProfile:
        """The points that ran: the row at the model's head size, then the family's variant."""
        p = self.profile if self.head_size is None else self.profile.at_head_size(self.head_size)
        return p.variant(self.variant) if self.variant else p

    def ran_experts(self) -> RoundingProfile:
        """The points the routed experts' gated product ran under: :meth:`ran` with the row's
        ``experts_variant`` applied (:meth:`rla.profiles.RoundingProfile.variant_on`)."""
        ran = self.ran()
        if not self.experts_variant:
            return ran
        row = self.profile if self.head_size is None else self.profile.at_head_size(self.head_size)
        return row.variant_on(self.experts_variant, ran)

    def modules(self, region: str) -> int:
        """Total modules aligned in ``region`` (0 when the region was not aligned)."""
        return sum(self.counts.get(region, {}).values())

    def to_dict(self) -> dict:
        d = asdict(self)
        d["profile"] = self.profile.name
        d["points"] = self.profile.points()
        if self.variant:  # what ran for the family's modules: at the model's head size, then the variant
            ran = self.ran()
            d["variant_points"] = {**ran.points(), **ran.kind_points(self.variant)}
        if self.experts_variant:
            d["experts_points"] = self.ran_experts().points()
        if self.head_size is not None:
            d["head_size_points"] = self.profile.at_head_size(self.head_size).points()
        return d

    def _rows(self) -> list[tuple[str, str, str]]:
        rows = []
        for region in (*REGIONS, *(("router",) if "router" in self.regions else ())):
            if region in self.regions:
                what = ", ".join(f"{n} {kind}" for kind, n in self.counts.get(region, {}).items())
                rounding = _rounding(self.ran(), region)
                if region == "swiglu" and self.experts_variant:
                    rounding += f"; routed experts {_rounding(self.ran_experts(), region)} ({self.experts_variant})"
                if region == "rmsnorm" and self.moe_out:
                    rounding += f"; MoE shared + routed {self.moe_out} (moe_out)"
                rows.append((region, what, rounding))
            else:
                rows.append((region, "not aligned (model's own code)", ""))
        if self.lm_head:  # the table says what was done in a word, the note below it in full
            done = "1 head" if self.lm_head.startswith("aligned") else self.lm_head.split(":")[0].split(" (")[0]
            rows.append(("lm_head", done, f"lm_head {self.ran().lm_head}"))
        return rows

    def _title(self) -> str:
        return (
            f"rla.align: profile {self.profile.name!r} on {self.family} ({self.model_class}), "
            f"transformers {self.transformers_version}"
        )

    def __str__(self) -> str:
        rows = [("region", "aligned modules", "rounding"), *self._rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [self._title()]
        if self.profile_choice:
            lines.append(f"  {self.profile_choice}")
        for r in rows:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if self.hazards:
            lines.append("  hazards fixed:")
            lines.extend(f"    - {h.name}: {h.detail}" for h in self.hazards)
        else:
            lines.append("  hazards fixed: none found")
        head = (f"lm_head: {self.lm_head}",) if self.lm_head and not self.lm_head.startswith("left as it is") else ()
        lines.extend(f"  note: {n}" for n in (*self.notes, *head))  # a head left as it is: the table's row says it
        return "\n".join(lines)

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        table = Table(title=self._title(), title_justify="left")
        for name in ("region", "aligned modules", "rounding"):
            table.add_column(name)
        for row in self._rows():
            table.add_row(*row)
        hazards = Text(
            "hazards fixed: "
            + ("none found" if not self.hazards else "; ".join(f"{h.name}: {h.detail}" for h in self.hazards))
        )
        choice = [Text(self.profile_choice)] if self.profile_choice else []
        return Group(*choice, table, hazards, *(Text(f"note: {n}") for n in self.notes))
