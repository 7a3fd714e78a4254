"""RLCracker: detector-free RL paraphrase attack that removes Unigram/KGW watermarks"""
