"""What Triton loads: the stages (the Python models, in a package every model version copies) and their
engines, and the generator that writes the model repository from the settings and the export."""
