
papers
empty