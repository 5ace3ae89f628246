"""`fishserve eval`: memory, speed and numerical fidelity of weight/KV-cache dtype choices.

Modules, in the order a run uses them: `configs` (what is compared), `int8_weights`
(weight-only int8 linears), `generate` (seeded fixed-length generation), `fidelity`
(teacher-forced logits vs the reference configuration), `mcd` (mel-cepstral distortion of the
decoded audio), `measure` (device memory and timing), `report` (table, JSON, plot), `run`.
"""
