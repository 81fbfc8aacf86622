"""Neurons (Dalvi et al. 2019, "What Is One Grain of Sand in the Desert? Analyzing Individual Neurons in Deep NLP
Models", AAAI): each layer's hidden units ranked by a linear probe's weights, and the top-ranked ones ablated
(``docs/neurons.md``)."""
