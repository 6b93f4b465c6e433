"""The delegate blob: schema.fbs, its generated code, and the writer/reader."""
