"""Draft heads trained on the target's own features: Medusa (extra decoding heads on the
last hidden state) and EAGLE (a one-layer network over features and token embeddings).

``data`` collects features from the target over local text, ``nets`` holds the networks,
``train`` fits them on this CPU, ``store`` caches them per target, ``evaluate`` measures
them; ``drafters/heads.py`` drafts with them.
"""
