from .giftless_env import giftless  # noqa: F401  (fixture)
