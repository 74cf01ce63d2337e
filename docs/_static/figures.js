// A figure linked to its own file opens full size in the browser. MyST turns a link to a local
// file into a download link (the attribute "download"), which saves the PNG instead of showing it.
document.addEventListener('DOMContentLoaded', () => {
  document.querySelectorAll('a[download]').forEach(link => {
    const image = link.querySelector('img');
    if (image) {
      link.removeAttribute('download');
      link.href = image.getAttribute('src');
    }
  });
});
