"""Task 2 look-alike: the cell-feature tables (train, validation, test) with the real columns, dtypes and label
shares, and notebook-like text in their text columns.
"""

from __future__ import annotations

import random

import pandas as pd

from themisto.ingest.lookalike_spec import SizeSpec, seed_for


# The 21 feature columns and their dtypes, as in the real test_features.pkl.
FEATURE_DTYPES: dict[str, str] = {
    "filename": "object", "cell_type": "object", "cell_number": "int64", "execution_count": "int64",
    "linesofcomment": "float64", "linesofcode": "float64", "variable_count": "float64",
    "function_count": "float64", "text/plain": "int64", "image/png": "int64", "text/html": "int64",
    "execute_result": "int64", "display_data": "int64", "stream": "int64", "error": "int64",
    "text": "object", "comment": "object", "code_line_before": "object", "code_line_after": "object",
    "markdown_heading": "object", "packages_info": "object",
}
# Label columns in the order the participant's `train_features.columns` printed them.
LABEL_COLUMNS: tuple[str, ...] = (
    "helper_functions", "load_data", "data_exploration", "data_preprocessing", "evaluation", "modelling",
    "prediction", "result_visualization", "save_results", "comment_only",
)
# Shares of `primary_label` in the real train split (the participant printed value_counts(normalize=True)).
PRIMARY_LABEL_SHARES: dict[str, float] = {
    "data_exploration": 0.285273, "data_preprocessing": 0.239328, "modelling": 0.158066,
    "helper_functions": 0.080062, "load_data": 0.074404, "result_visualization": 0.050060,
    "evaluation": 0.039945, "prediction": 0.030859, "comment_only": 0.023144, "save_results": 0.018858,
}
PRIMARY_LINE_SHARE = 0.5  # share of a cell's code lines typical of its primary label


# ---------------------------------------------------------------------------------------------- task 2


def cell_feature_splits(spec: SizeSpec, seed: int) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Return (train, validation, test) cell-feature frames: 32, 32 and 21 columns, dtypes as the real data."""
    rng = random.Random(int(seed_for(seed, "task2").generate_state(1)[0]))
    used_names: set[int] = set()
    train = _features_frame(_notebook_rows(rng, spec.train_rows, used_names), labelled=True)
    validation = _features_frame(_notebook_rows(rng, spec.validation_rows, used_names), labelled=True)
    test = _features_frame(_notebook_rows(rng, spec.test_rows, used_names), labelled=False)
    return train, validation, test


def _features_frame(rows: list[dict], labelled: bool) -> pd.DataFrame:
    columns = list(FEATURE_DTYPES) + (["primary_label", *LABEL_COLUMNS] if labelled else [])
    frame = pd.DataFrame({c: [r[c] for r in rows] for c in columns})
    for column, dtype in FEATURE_DTYPES.items():
        frame[column] = frame[column].astype(dtype)
    for column in LABEL_COLUMNS if labelled else ():
        frame[column] = frame[column].astype("int64")
    return frame


def _notebook_rows(rng: random.Random, n_rows: int, used_names: set[int]) -> list[dict]:
    rows: list[dict] = []
    while len(rows) < n_rows:
        # Cells per notebook: real test split has mean 20, median 15, max 127.
        n_cells = min(max(1, int(rng.lognormvariate(2.65, 0.75))), n_rows - len(rows), 130)
        number = rng.randrange(1, 70000)
        while number in used_names:
            number = rng.randrange(1, 70000)
        used_names.add(number)
        rows.extend(_notebook(rng, f"nb_{number}.ipynb", n_cells))
    return rows


def _notebook(rng: random.Random, filename: str, n_cells: int) -> list[dict]:
    labels = list(PRIMARY_LABEL_SHARES)
    shares = list(PRIMARY_LABEL_SHARES.values())
    cells = []
    cell_number = rng.randrange(0, 3)
    execution_count = 0
    heading: object = 0
    for _ in range(n_cells):
        primary = rng.choices(labels, weights=shares)[0]
        extra = [lab for lab in labels if lab != primary and lab != "comment_only" and rng.random() < 0.06]
        text, comment = _cell_code(rng, primary, extra)
        if rng.random() < 0.45:  # a markdown cell sits before this one
            cell_number += 1 + int(rng.expovariate(1.2))
            heading = [rng.choice(_HEADINGS)] if rng.random() < 0.85 else heading
        if rng.random() < 0.09:
            shown_count = -1  # never executed in the saved notebook
        else:
            execution_count += 1 + (int(rng.expovariate(0.45)) if rng.random() < 0.5 else 0)
            shown_count = execution_count
        cells.append({
            "filename": filename, "cell_type": "code", "cell_number": cell_number,
            "execution_count": shown_count, "linesofcomment": float(len(comment)),
            "linesofcode": float(len(text)), "variable_count": float(_count_variables(text)),
            "function_count": float(sum(line.lstrip().startswith("def ") for line in text)),
            **_outputs(rng, primary, shown_count),
            "text": text, "comment": comment, "markdown_heading": heading,
            "packages_info": _packages_info(rng, text),
            "primary_label": primary,
            **{lab: int(lab == primary or lab in extra) for lab in LABEL_COLUMNS},
        })
        cell_number += 1
    # The neighbours' code lines: [last line of the previous code cell] / [first line of the next]; 0 at the ends.
    for i, cell in enumerate(cells):
        before = cells[i - 1]["text"] if i > 0 else []
        after = cells[i + 1]["text"] if i + 1 < len(cells) else []
        cell["code_line_before"] = [before[-1]] if before else 0
        cell["code_line_after"] = [after[0]] if after else 0
    return cells


def _outputs(rng: random.Random, label: str, execution_count: int) -> dict[str, int]:
    shows = {"data_exploration": 0.6, "evaluation": 0.45, "prediction": 0.3, "result_visualization": 0.2}
    plots = {"result_visualization": 0.85, "data_exploration": 0.2, "evaluation": 0.2}
    prints = {"modelling": 0.35, "evaluation": 0.4, "data_exploration": 0.25, "load_data": 0.15}
    ran = execution_count != -1
    execute_result = int(ran and rng.random() < shows.get(label, 0.1))
    display_data = 0
    if ran and rng.random() < plots.get(label, 0.03):
        display_data = 1 + (int(rng.expovariate(0.9)) if rng.random() < 0.2 else 0)
    stream = 0
    if ran and rng.random() < prints.get(label, 0.12):
        stream = 1 if rng.random() < 0.9 else 1 + int(rng.paretovariate(1.1))  # long training logs exist
    return {
        "text/plain": execute_result + display_data,
        "image/png": display_data,
        "text/html": int(execute_result and label == "data_exploration" and rng.random() < 0.5),
        "execute_result": execute_result, "display_data": display_data, "stream": min(stream, 1000),
        "error": int(ran and rng.random() < 0.009),
    }


def _count_variables(text: list[str]) -> int:
    names = []
    for line in text:
        head, sep, _ = line.partition("=")
        if sep and not line.lstrip().startswith(("#", "def ", "if ", "for ", "print(")) and "==" not in line \
                and "(" not in head:
            names.extend(n.strip() for n in head.split(","))
    return len(dict.fromkeys(n for n in names if n))


def _cell_code(rng: random.Random, primary: str, extra: list[str]) -> tuple[list[str], list[str]]:
    comments = [rng.choice(_COMMENTS) for _ in range(rng.randrange(1, 4) if rng.random() < 0.35 else 0)]
    if primary == "comment_only":
        return [], comments or [rng.choice(_COMMENTS)]
    n_lines = max(1, min(int(rng.lognormvariate(1.0, 0.95)), 60))
    fill = _Fill(rng)
    text = []
    for _ in range(n_lines):
        # Real cells mix activities: about half of the lines carry the primary label's typical code, which
        # leaves a text classifier near the participant's F1 (0.72) rather than near 1.
        draw = rng.random()
        label = primary if draw < PRIMARY_LINE_SHARE else rng.choice(extra) if extra and draw < 0.6 \
            else rng.choice(_SNIPPET_LABELS)
        text.append(fill(rng.choice(_SNIPPETS[label])))
    if primary == "helper_functions":
        text = [fill("def {fn}({var}):")] + ["    " + line for line in text] + [fill("    return {var}")]
    return text, comments


class _Fill:
    """Fills a snippet's placeholders with names chosen by the notebook's RNG."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def __call__(self, snippet: str) -> str:
        pick = self.rng.choice
        return snippet.format(
            df=pick(("df", "data", "train", "test", "df_train", "dataset")), col=pick(_COLUMNS),
            model=pick(("model", "clf", "rf", "lr", "xgb", "knn")), file=pick(_FILES),
            fn=pick(("clean_text", "load", "preprocess", "get_features", "plot_history", "score")),
            var=pick(("x", "row", "s", "values", "arr", "name")), n=pick((3, 5, 10, 42, 100, 200, 1000)),
            X=pick(("X", "X_train", "features")), y=pick(("y", "y_train", "target", "labels")),
        )


_COLUMNS = ("age", "price", "Survived", "label", "text", "date", "category", "SalePrice", "target", "income")
_FILES = ("train", "test", "data", "sales", "titanic", "reviews", "housing", "tweets")
_SNIPPETS: dict[str, tuple[str, ...]] = {
    "load_data": (
        "import pandas as pd", "import numpy as np", "{df} = pd.read_csv('{file}.csv')",
        "{df} = pd.read_csv('../input/{file}.csv', index_col=0)", "{df} = pd.read_json('{file}.json')",
        "with open('{file}.txt') as f:", "    lines = f.readlines()", "{df} = pd.read_excel('{file}.xlsx')",
        "from sklearn.datasets import load_iris", "import matplotlib.pyplot as plt",
    ),
    "helper_functions": (
        "{var} = {var}.strip().lower()", "if {var} is None:", "for {var} in values:",
        "result = [{var} for {var} in {df}['{col}']]", "{var} = np.log1p({var})", "out.append({var})",
    ),
    "data_preprocessing": (
        "{df}['{col}'] = {df}['{col}'].fillna(0)", "{df} = {df}.dropna()", "{X} = {df}.drop('{col}', axis=1)",
        "{y} = {df}['{col}']", "{df}['{col}'] = {df}['{col}'].astype(int)",
        "X_train, X_test, y_train, y_test = train_test_split({X}, {y}, test_size=0.2)",
        "scaler = StandardScaler()", "{X} = scaler.fit_transform({X})",
        "{df} = pd.get_dummies({df}, columns=['{col}'])", "{df}['{col}'] = {df}['{col}'].map({{'a': 0, 'b': 1}})",
    ),
    "data_exploration": (
        "{df}.head()", "{df}.describe()", "{df}['{col}'].value_counts()", "{df}.shape", "{df}.info()",
        "print({df}.columns)", "{df}.isnull().sum()", "{df}.groupby('{col}').mean()", "{df}.corr()",
        "{df}['{col}'].unique()", "sns.countplot(x='{col}', data={df})",
    ),
    "modelling": (
        "{model} = RandomForestClassifier(n_estimators={n})", "{model}.fit({X}, {y})",
        "{model} = LogisticRegression(C=1.0)", "{model} = GradientBoostingRegressor(max_depth={n})",
        "from sklearn.ensemble import RandomForestClassifier", "{model}.add(Dense({n}, activation='relu'))",
        "history = {model}.fit({X}, {y}, epochs={n}, batch_size=32)", "{model} = KNeighborsClassifier({n})",
    ),
    "prediction": (
        "y_pred = {model}.predict(X_test)", "preds = {model}.predict_proba(X_test)[:, 1]",
        "predictions = {model}.predict({X})", "test['{col}'] = {model}.predict(test_X)",
    ),
    "evaluation": (
        "print(accuracy_score(y_test, y_pred))", "confusion_matrix(y_test, y_pred)",
        "print(classification_report(y_test, y_pred))", "mean_squared_error(y_test, y_pred)",
        "scores = cross_val_score({model}, {X}, {y}, cv={n})", "roc_auc_score(y_test, preds)",
    ),
    "result_visualization": (
        "plt.plot(history.history['loss'])", "plt.figure(figsize=(10, 6))", "plt.show()",
        "sns.heatmap(cm, annot=True)", "plt.title('{col}')", "plt.xlabel('{col}')",
        "plt.scatter({df}['{col}'], y_pred)", "{df}['{col}'].hist(bins={n})",
    ),
    "save_results": (
        "submission.to_csv('submission.csv', index=False)", "{model}.save('{file}.h5')",
        "pickle.dump({model}, open('{file}.pkl', 'wb'))", "{df}.to_csv('{file}_clean.csv')",
        "submission = pd.DataFrame({{'id': test.index, '{col}': y_pred}})",
    ),
}
_SNIPPET_LABELS = tuple(_SNIPPETS)
_COMMENTS = (
    "# Load the data", "# TODO: tune parameters", "# Plot the results", "# Split into train and test",
    "# your code here", "# check for missing values", "# Train the model", "# aesthetics",
)
_HEADINGS = (
    "## Data exploration", "# Load the data", "### Feature engineering", "## Model", "## Results",
    "Now we train the model on the training set", "## Evaluation", "# Introduction",
)
_PACKAGE_INFO = {
    "pandas": "pandas provides labelled data structures for tabular and time series data.",
    "numpy": "NumPy is the package for array computing with Python.",
    "matplotlib": "Matplotlib produces static, animated and interactive plots in Python.",
    "sklearn": "scikit-learn is a Python module for machine learning built on top of SciPy.",
}


def _packages_info(rng: random.Random, text: list[str]) -> list[str]:
    info = []
    for line in text:
        if line.startswith(("import ", "from ")):
            package = line.split()[1].split(".")[0]
            if package in _PACKAGE_INFO and rng.random() < 0.7:
                info.append(_PACKAGE_INFO[package])
    return info
