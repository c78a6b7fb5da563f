"""``python -m transformer_course.training ddp-demo ...``: the launcher of the data-parallel
demonstration (:func:`.ddp.main`), also what ``torchrun`` starts in every process."""

from .ddp import main

if __name__ == "__main__":
    main()
