// The collection form: choosing another embedding provider puts that provider's default model in
// the model field, unless the curator typed a model of their own.
document.addEventListener("DOMContentLoaded", () => {
  const provider = document.getElementById("id_embedding_provider");
  const model = document.getElementById("id_embedding_model_name");
  if (!provider || !model) return;
  const defaults = JSON.parse(provider.dataset.defaultModels);
  provider.addEventListener("change", () => {
    const typed = model.value.trim();
    if (!typed || Object.values(defaults).includes(typed)) model.value = defaults[provider.value] || "";
  });
});
