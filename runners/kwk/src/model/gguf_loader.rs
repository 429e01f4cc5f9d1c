//! Loading a GGUF file into master weights (names mapped, q/k permutation undone).
