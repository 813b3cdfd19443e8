"""Diagnosis: where a model's train/rollout mismatch comes from, and static hazards.

``rla.diagnose(model, records, profile)`` (attribution to regions, profile detection),
``rla.detect_profile(model, records)``, ``rla.doctor(model)``; reports in :mod:`.report`.
"""

from rla.diagnosis.core import Diagnosis, detect_profile, diagnose
from rla.diagnosis.doctor import Hazard, doctor

__all__ = ["Diagnosis", "diagnose", "detect_profile", "Hazard", "doctor"]
