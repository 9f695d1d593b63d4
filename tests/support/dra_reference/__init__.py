"""The plain-Python reference of the inventory conversion and the v1 DRA rules, which production
runs in Rust (`rust/src/inventory/`): these modules were the production code until then; the
property tests (tests/unit/resources/test_inventory_native_property.py) hold the two equal."""
