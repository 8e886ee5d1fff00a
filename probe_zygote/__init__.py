"""The worker zygote process: forks probe workers from preloaded memory, and is their netns broker."""
