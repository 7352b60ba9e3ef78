"""Example user model classes, loaded by import path through the `custom` provider.

They stand in for the classes a user keeps in their own package: plain Python classes in the `@daft.cls` / Ray
`map_batches` shape (constructor loads the model once, a batch method maps a dict of columns to outputs).
"""
