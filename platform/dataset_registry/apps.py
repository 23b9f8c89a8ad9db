from django.apps import AppConfig


class DatasetsConfig(AppConfig):
    # The module is not named `datasets`: that is Hugging Face's package, which transformers
    # looks for on the path the platform's apps are on. The label keeps the short name, so
    # tables, migrations and "datasets.Dataset" references read as before.
    name = "dataset_registry"
    label = "datasets"
