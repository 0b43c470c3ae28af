"""Analysis of result sets: tidy frames, statistics, plots, the HTML report, compare, history. The package imports
nothing: `zcorch --help` reads zcorch.analysis.gate without pandas and scipy."""
