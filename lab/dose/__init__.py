"""The dose-response study (issue #19): its knob, report and probe, run through ``rla``'s plugs."""
