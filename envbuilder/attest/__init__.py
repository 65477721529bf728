"""Signed proof that an image passed verify (docs/attestation.md), one module one job:

    statement.py   the in-toto Statement v1 (a passing verify only; the build provenance) and its
                   canonical text, with the one line the job gate matches
    subject.py     what a statement is about: a SIF's sha256 (hashed once, streamed), an image's ID
    bounded.py     an attestation or key file handed in: size-bounded read, shape checked
    keys.py        a key file is a key (PEM shape), never generated, never copied
    cosign.py      cosign sign-blob / verify-blob (a bundle beside the SIF), attest /
                   verify-attestation (the registry digest): offline, no transparency log
    sifsign.py     apptainer sif add (group 1) + apptainer sign / verify: the attestation inside
                   the SIF's signed group
    check.py       the whole check: signature by a trusted key, subject = these bytes, verify
                   passed, this stack; one reason (no attestation, wrong key, digest differs,
                   verify failed, other stack)
    commands.py    `envbuilder verify --attest`, `envbuilder attest sign|check|provenance`: what the
                   command line (cli.py, the only argparse layer) calls
"""
