"""The estate harness the end-to-end tests (tests/e2e), the golden tests and
the drills (scripts/drill) share, imported from one root, scripts/ (meson
sets PYTHONPATH for the tests; scripts/drill adds its own folder):

  estate.py          the estate in network namespaces, spillwayd's start and
                     stop, the checks and their floor, log() and wait_until()
  estate_toml.py     the one writer of a test estate's configuration
  ctl.py             spillwayctl --json and the CLI socket, as clients
  maglev_model.py    which backend spillwayd gives a flow, from the TOML
  maglev_reference.py  the independent SipHash + weighted Maglev arithmetic
"""
