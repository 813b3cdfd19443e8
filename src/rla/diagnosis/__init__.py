"""Diagnosis: where a model's train/rollout mismatch comes from, whether it is rounding at all, and
static hazards.

``rla.diagnose(model, records, profile)`` (input checks, rounding scale, verdict, attribution to
regions, profile detection), ``rla.detect_profile(model, records)``, ``rla.doctor(model)``;
reports in :mod:`.report`, staged output folders in :mod:`.output`, provenance in :mod:`.provenance`.
"""

from rla.diagnosis.core import Detection, Diagnosis, detect_profile, diagnose
from rla.diagnosis.doctor import Hazard, doctor
from rla.diagnosis.verdict import Verdict

__all__ = ["Diagnosis", "Detection", "Verdict", "diagnose", "detect_profile", "Hazard", "doctor"]
