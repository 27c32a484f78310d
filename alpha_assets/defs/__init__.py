"""The dg defs folder: `alpha_assets.definitions` loads every module here with `dg.load_from_defs_folder`.

Each module registers one part of the lineage; the code lives in alpha_assets' own modules. `dg scaffold defs
dagster.asset x.py` adds a module here.
"""
